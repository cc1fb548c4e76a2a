"""Superset configuration for pgdp's Superset test (tests/tools/superset/superset_checks.py).

Superset runs in-process (Flask's test client, no web server) with a throwaway SQLite metadata
database whose path the program sets in PGDP_SUPERSET_METADATA_DB. Nothing here is a secret: the
key signs sessions of a test that lives for a minute and never listens on a port.
"""

import os

SECRET_KEY = "pgdp-superset-test-only-not-a-secret"
SQLALCHEMY_DATABASE_URI = "sqlite:///" + os.environ["PGDP_SUPERSET_METADATA_DB"]

# The API is driven with a JWT from /api/v1/security/login: no CSRF tokens, no rate limits, no
# HTTP security headers to satisfy.
WTF_CSRF_ENABLED = False
AUTH_RATE_LIMITED = False
RATELIMIT_ENABLED = False
TALISMAN_ENABLED = False

# Every chart asks its database again (Superset's defaults; spelled out because the test depends on
# it): a cached answer would hide what pgdp says.
CACHE_CONFIG = {"CACHE_TYPE": "NullCache"}
DATA_CACHE_CONFIG = {"CACHE_TYPE": "NullCache"}

# Superset's stock limits, spelled out because the SQL it sends contains them.
ROW_LIMIT = 50000
FILTER_SELECT_ROW_LIMIT = 10000
DEFAULT_SQLLAB_LIMIT = 1000

# No telemetry, no example data, no background workers.
SCARF_ANALYTICS = False
FEATURE_FLAGS = {"GLOBAL_ASYNC_QUERIES": False}
