"""What to do after a failed training run: the cause, in one line, and the next command. A full disk (the plugin's
atomic saves keep checkpoint_last.pt whole: resume once there is room); a corrupt checkpoint_last.pt (unreadable, or a
bit flip its CRCs show: resume from the newest intact one); another model's checkpoint (a new OUT_DIR); NaN/Inf
(fairseq's "gradients are Nan/Inf", whose NanDetector then crashes on its own, or fp16's "Minimum loss scale
reached": half the learning rate); refused arguments; bad data (rebuild it); else the last error line (resume).
"""

import glob
import os
import pickle
import re
import shlex
import shutil
from typing import Optional, Sequence

from harness import config, fairseq_log
from harness.fairseq_log import last_value

# what a checkpoint that cannot be read raises (torch's zip reader, the unpickler, a missing key;
# the plugin's CorruptCheckpoint and UnsafeCheckpoint are ValueErrors)
LOAD_ERRORS = (OSError, RuntimeError, KeyError, EOFError, ValueError, pickle.UnpicklingError)
# the sizes that make a model: fairseq's flags and its args' names
MODEL_FLAGS = ("arch", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
               "encoder_attention_heads", "decoder_attention_heads", "encoder_layers", "decoder_layers")


def _checkpoints():
    """tfixup.checkpoints, imported (with torch) by the steps that read one: a failure's advice mostly reads logs."""
    from tfixup import checkpoints

    return checkpoints


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def num_updates(path, check_crc: bool = False) -> int:
    """The update count a checkpoint was saved at, without reading its tensors (``check_crc``: the whole file, once)."""
    return updates_of(_checkpoints().load(path, mmap=True, check_crc=check_crc), path)


def updates_of(state, path) -> int:
    """The update count in a loaded checkpoint's state."""
    try:
        return int(state["optimizer_history"][-1]["num_updates"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise _checkpoints().CorruptCheckpoint(
            path, "no optimizer_history with num_updates: not a checkpoint fairseq-train wrote") from None


def newest_intact(ckpt_dir: str, exclude=("checkpoint_last.pt",)):
    """(path, updates) of the checkpoint with the most updates that loads and passes its CRC check, or None; among
    equals, a numbered checkpoint_E_U.pt before checkpoint_best.pt."""
    found = []
    for path in [p for p in glob.glob(os.path.join(ckpt_dir, "checkpoint*.pt")) if os.path.basename(p) not in exclude]:
        try:
            found.append((num_updates(path), "best" not in os.path.basename(path), path))
        except LOAD_ERRORS:
            continue
    for updates, _, path in sorted(found, reverse=True):  # newest first; read whole only until one passes
        try:
            _checkpoints().verify(path)
        except LOAD_ERRORS:
            continue
        return path, updates
    return None


def corrupt_last_advice(last: str, error, command: str) -> str:
    """What is wrong with LAST, from the error its loading raised, and the commands that go on."""
    if type(error).__name__ == "NotACheckpoint":  # names the file already
        head = str(error)
    elif getattr(error, "reason", None):  # tfixup.checkpoints.CorruptCheckpoint
        head = f"{last} is corrupt ({error.reason})"
    elif type(error).__name__ == "UnsafeCheckpoint":  # names the file and the field already
        head = first_line(error)
    else:
        head = f"{last} is corrupt (cannot be read: {first_line(error)})"
    intact, q = newest_intact(os.path.dirname(last)), shlex.quote
    move = f"mv {q(last)} {q(last + '.corrupt')}"
    if intact is None:
        return f"{head} and no other checkpoint loads: start over with: {move} && {command}"
    return (f"{head}; the newest intact checkpoint is {os.path.basename(intact[0])} ({intact[1]} updates): "
            f"resume from it with: {move} && cp {q(intact[0])} {q(last)} && {command}")


def _model_args(state) -> dict:
    """The model's flags as fairseq stored them: state["args"], or state["cfg"]["model"] (a Namespace for models
    configured from the command line, else a dict)."""
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if isinstance(cfg, dict) else None
    for holder in (model, state.get("args")):
        if holder is not None:
            return dict(vars(holder)) if hasattr(holder, "__dict__") else dict(holder)
    return {}


def model_mismatch(state, words: Sequence[str]) -> Optional[str]:
    """How the checkpoint's model differs from the one the fairseq-train command WORDS trains (its --arch and size
    flags): "arch transformer, not transformer_tfixup; ...", or None. Only what both state."""
    saved = _model_args(state)
    wanted = {w[2:].replace("-", "_"): words[i + 1] for i, w in enumerate(words[:-1])
              if w.startswith("--") and w[2:].replace("-", "_") in MODEL_FLAGS}
    differ = [f"{k} {saved[k]}, not {wanted[k]}" for k in MODEL_FLAGS
              if k in saved and k in wanted and str(saved[k]) != wanted[k]]
    return "; ".join(differ) or None


def foreign_model_advice(last: str, what: str) -> str:
    return (f"{last} holds another model than this run trains ({what}): it is not this run's checkpoint "
            "(a run directory of another experiment or settings); use a new OUT_DIR for this run, "
            "or train the experiment that made it")


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:.0f} MB" if n >= 2 ** 20 else f"{n / 1024:.0f} KB"


def _retry(argv: Sequence[str], key: str, value: str, new_out: Optional[str] = None) -> str:
    """ARGV (bash scripts/train.sh ...) with --set KEY=VALUE after the script's own options (before "--", so that it
    wins over an earlier --set); NEW_OUT (old, new): the run's folder replaced."""
    words = list(argv)
    end = words.index("--") if "--" in words else len(words)
    at = [j for j in range(end) if new_out is not None and words[j] == new_out[0]]
    if at:
        words[at[-1]] = new_out[1]
    return shlex.join(words[:end] + ["--set", f"{key}={value}"] + words[end:])


def _config_value(run_dir: str, key: str, own: bool = True) -> Optional[float]:
    """KEY as the run trained with it (OWN False: its record), or in the run's config file itself (no environment, no
    --set): where a run whose value was overridden far off goes back to (half of LR=1e9 diverges as surely)."""
    try:
        rec = config.read_record(run_dir)
        return float((config.resolve(rec["config_file"], environ={}).values if own else rec["values"])[key])
    except (OSError, ValueError, KeyError, TypeError):  # config.ConfigError is a ValueError
        return None


def train_failure(log_text: str, rc: int, run_dir: str, argv: Sequence[str]) -> str:
    """One line: why fairseq-train failed (exit RC, log LOG_TEXT) in RUN_DIR, and what to run next. ARGV is the
    training command (bash scripts/train.sh ...), which resumes."""
    command = shlex.join(argv)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    last = os.path.join(ckpt_dir, "checkpoint_last.pt")
    run = fairseq_log.last_run(log_text)  # train.log is appended to by every run: the failed one only

    saved = glob.glob(os.path.join(ckpt_dir, "checkpoint*.pt"))
    need = max([os.path.getsize(p) for p in saved] or [0])
    free = shutil.disk_usage(run_dir if os.path.isdir(run_dir) else ".").free
    if fairseq_log.DISK.search(run) or free < need:  # (torch names no errno; the plugin's saves do: checkpoints.save)
        q, resume = shlex.quote, command
        state = "no checkpoint was saved yet (the rerun starts over)"
        if os.path.exists(last):
            try:
                state = f"checkpoint_last.pt is intact ({num_updates(last, check_crc=True)} updates)"
            except LOAD_ERRORS as e:
                return f"disk full (ENOSPC) while training; {corrupt_last_advice(last, e, command)}"
        elif intact := newest_intact(ckpt_dir):
            path, updates = intact
            state = f"the newest checkpoint is {os.path.basename(path)} ({updates} updates)"
            resume = f"cp {q(path)} {q(last)} && {command}"
        size = f", a checkpoint is {_mb(need)}" if need else ""
        return (f"disk full (ENOSPC) on the disk of {run_dir} ({_mb(free)} free{size}): training stopped; {state}; "
                f"free some space, then resume with: {resume}")

    if fairseq_log.NAN.search(run):
        if os.path.exists(last):  # a bit flip in checkpoint_last.pt loads without error and trains into NaN
            try:
                _checkpoints().verify(last)
            except LOAD_ERRORS as e:
                return corrupt_last_advice(last, e, command)
        m = re.search(r"gradients are Nan/Inf|Minimum loss scale reached", run)
        what = m.group(0) if m else "NaN/Inf"
        lr = _config_value(run_dir, "LR", own=False)
        lower = "lower LR (--set LR=...)"
        if lr is not None:
            own = _config_value(run_dir, "LR")  # gone back to when the run's LR was set 10x above it, else half
            half = f"{own:g}" if own is not None and lr >= 10 * own else f"{lr / 2:g}"
            # the run is bound to its LR once it holds checkpoints: another LR is another run
            new_out = (run_dir, f"{run_dir.rstrip('/')}-lr{half}") if saved else None
            where = f" in a new OUT_DIR (this one holds checkpoints of LR={lr:g})" if saved else ""
            lower = f"lower LR (was {lr:g}){where}, e.g.: {_retry(argv, 'LR', half, new_out)}"
        return (f"training diverged ({what}) after update {last_value(run, 'num_updates')} (last logged: loss "
                f"{last_value(run, 'loss')}, lr {last_value(run, 'lr')}): rerunning will diverge again; {lower}; or "
                "use a longer DECAY_PERIOD (T-Fixup) or WARMUP_UPDATES (baselines), and train deep models in fp32 "
                "(--set FP16=0) instead of fp16")

    if fairseq_log.CKPT.search(run) and os.path.exists(last):
        try:
            state = _checkpoints().load(last, mmap=True, check_crc=True)
        except LOAD_ERRORS as e:
            return corrupt_last_advice(last, e, command)
        if fairseq_log.LOAD_MODEL.search(run):  # it loads, but its tensors do not fit this run's model
            sizes = fairseq_log.SIZE.findall(run)
            dictionary = re.compile(r"(embed_tokens|output_projection)\.weight$")
            if sizes and all(dictionary.search(n) and a.split(",")[1:] == b.split(",")[1:] for n, a, b in sizes):
                name, a, b = sizes[0]
                return (f"{last} was trained with other dictionaries than this data-bin's ({name}: "
                        f"{a.split(',')[0]} symbols in the checkpoint, {b.split(',')[0]} now): the data-bin changed "
                        "since this run started; train on the data-bin it started with, or in a new OUT_DIR")
            what = _model_args(state).get("arch", "?")
            detail = (f"{sizes[0][0]} {sizes[0][1]} in the checkpoint, {sizes[0][2]} now" if sizes
                      else "other parameters")
            return foreign_model_advice(last, f"a {what} model: {detail}")

    if rc == 2 and (m := fairseq_log.ARGS.search(run)):
        return (f"fairseq-train refused its arguments ({m.group(1).strip()[:200]}): fix EXTRA_TRAIN_ARGS in the "
                f"config (or --set EXTRA_TRAIN_ARGS=...) or the arguments after --, then rerun; nothing was trained")
    if m := fairseq_log.DATA.search(run):
        return (f"fairseq-train could not use the data ({m.group(0)}): rebuild the data-bin with "
                "scripts/prepare-*.sh (rerunning the same command will fail the same way)")
    if m := fairseq_log.TOKENS.search(run):
        own = _config_value(run_dir, "MAX_TOKENS") or 0
        return (f"no sentence pair fits in a batch of MAX_TOKENS tokens (fairseq: {m.group(0)}): set MAX_TOKENS above "
                f"the longest pair, e.g. {_retry(argv, 'MAX_TOKENS', str(int(max(own, 4096))))}; nothing was trained")
    if (why := fairseq_log.NOT_RUN.search(run)) or rc in (126, 127):
        fix = ("shorten EXTRA_TRAIN_ARGS or the arguments after -- (the command line is over the system's limit)"
               if why and "too long" in why.group(0) else "check that fairseq is installed (bash scripts/install.sh)")
        return f"fairseq-train could not be started ({why[0] if why else f'exit {rc}'}): {fix}; nothing was trained"
    refused = [line.strip() for line in fairseq_log.REFUSED.findall(run)]
    if refused:  # the plugin's one-line refusal of a setting or an input (tfixup/errors.py): no crash to resume
        return (f"{refused[-1][:400]} (fairseq-train refused the run: rerunning the same command will fail the same "
                "way until that is fixed)")
    errors = [line.strip() for line in fairseq_log.EXCEPTION.findall(run)]
    if rc in (137, -9, 143, -15) or not errors:
        # killed (the OOM killer, a preemption) or ended without an error of its own: resuming is the fix
        cause = "killed (SIGKILL: out of memory?)" if rc in (137, -9) else f"exit {rc}"
        return (f"fairseq-train failed: {cause}; see the log. If it was killed or preempted, "
                f"rerun the same command to resume from checkpoint_last.pt: {command}")
    # an error of fairseq's or the plugin's own: the same command fails the same way
    return (f"fairseq-train failed: {errors[-1][:300]}; see {os.path.join(run_dir, 'train.log')} (rerunning the same "
            "command will fail the same way until its cause is fixed)")
