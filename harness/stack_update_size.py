"""``python -m harness.stack_update_size``: ``tfixup-diagnose update-size --family torch`` under the name the
records in results/diagnostics carry (tfixup/update_size_stacks.py)."""
import functools

from tfixup import update_size_stacks

main = functools.partial(update_size_stacks.main, family="torch", prog="python -m harness.stack_update_size")
if __name__ == "__main__":
    main()
