"""Writes the scenario file's JSON Schema: `python -m periscope.sim.scenario > docs/scenario.schema.json`."""

import json

from periscope.sim.scenario import json_schema

print(json.dumps(json_schema(), indent=2))
