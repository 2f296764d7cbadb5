"""`python -m reasonrl.sandbox`: the sandbox layers in force on this machine, as JSON."""

import json

from . import describe

print(json.dumps(describe(), indent=2))
