"""``python -m obsdelta_cli``: the same as the ``obsdelta`` command."""

from .cli import main

if __name__ == "__main__":
    main()
