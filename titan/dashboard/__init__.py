"""The live dashboard's page (``static/``: HTML, script, style), package data only: the routes
are ``titan/api/routes/dashboard.py``, the numbers ``titan/service/dashboard.py``."""
