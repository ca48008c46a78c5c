"""Ready-made training programs, run with ``python -m`` or ``paramshard launch -m``."""
