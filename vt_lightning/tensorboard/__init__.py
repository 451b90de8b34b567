"""The ``vt_lightning`` TensorBoard tab (``plugin.py``: its routes; ``scan.py``: the log dir's index;
``static/``: its hand-written frontend). A reader like ``cli/``: it reads what the callback wrote and
never imports the training side or torch."""
