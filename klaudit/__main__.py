"""`python -m klaudit` runs the command-line interface."""

from klaudit.cli import main

if __name__ == "__main__":
    main()
