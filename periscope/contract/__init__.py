"""The output contract: what users read, one module per output kind.

Each module defines, for its kind, the JSON shape (the functions that render it from the domain type,
periscope.core.model), and the pydantic models that describe that shape in /openapi.json and the docs:
attribution (pod attribution rows, a pod with its rows, window stats, idle rows), gpu (GPU state with
its MIG slices), finding, xid (an XID with the owners it hit) and owners (who owned what at an instant).
The HTTP API, `periscope replay`, /v1/owners, the web view and `periscope top` all read these shapes;
`values` holds the renderings they share (times, numbers, MIG references, owners).

Unknown is null everywhere: a time of 0, a non-finite number and an empty identity string (a pod UID
that could not be told, a GPU a device ID names none of) are written as `null`, never as 0 or "".
"""
