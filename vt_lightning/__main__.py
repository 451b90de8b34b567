"""``python -m vt_lightning summary|diff|view``: the ``vt-lightning`` command without the script."""

from vt_lightning.cli.command import console_main

if __name__ == "__main__":
    console_main()
