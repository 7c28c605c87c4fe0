"""``python -m harness.hf_update_size``: ``tfixup-diagnose update-size --family hf`` under the name the records in
results/hf carry (tfixup/update_size_stacks.py)."""
import functools

from tfixup import update_size_stacks

main = functools.partial(update_size_stacks.main, family="hf", prog="python -m harness.hf_update_size")
if __name__ == "__main__":
    main()
