"""Compression of the changelogged table records: zlib with a preset dictionary.

A pod record is some 1.3 KB of JSON, most of it the same keys and words in every record; compressed on
its own, zlib has nothing earlier in the stream to point back to, and the record still took 540-590
bytes. The worker keeps the latest record of every key in memory (Faust's memory store): with the
node's own record, some 900 bytes a pod-device row. With a preset dictionary holding that common text
(the standard zlib mechanism, RFC 1950's FDICT), a pod record takes 330 bytes (460 with the previous
version it carries), and the tables some 580 bytes a row.

The dictionary is part of the record format: a record names the dictionary it needs by its Adler-32
(the zlib header's DICTID), and a reader finds it in DICTIONARIES. So a dictionary, once written, is
never edited; a better one is added beside it, and new records use the newest. Records compressed
without a dictionary (all those written before it) read as before.
"""

from __future__ import annotations

import zlib

LEVEL = 1  # nearly the ratio of 6 at a third of the CPU

# The text pod and node records share (periscope.core.snapshot, services.joiner.changelog), the most
# frequent last (zlib reaches the end of a dictionary with the shortest distances). Never edit: add.
_DICT_1 = (
    b'"state":{"format":1,"node":"","pods":[{"info":{"uid":"","namespace":"","name":"","node":"",'
    b'"phase":"Running","qos":"guaranteed","owner_kind":"","owner_name":"","labels":[],"created_ms":17,'
    b'"deletion_ms":0,"resource_version":"","containers":[{"name":"","container_id":"","requests":'
    b'[["nvidia.com/gpu","1"]],"limits":[["nvidia.com/gpu","1"]],"claims":[],"init":false,"runtime":""}],'
    b'"claim_statuses":[],"mirror_of":"","claim_devices":[],"started_ms":17},"first":17,"deleted":0,'
    b'"ver":[1,1]}],"allocs":[],"alloc_repeats":[],"inventory":{"node":"","gpus":[{"uuid":"GPU-",'
    b'"index":0,"model":"NVIDIA ","memory_mib":81559.0,"mig_mode":false,"mig":[]}]},"node_event":null,'
    b'"pending":[{"t":"tel","v":{"meta":{"node":"","source":"probe","epoch":0,"seq":0,'
    b'"time_ms":17},"devices":[{"uuid":"GPU-","parent_uuid":"","index":0,"mig":null,"util_pct":0.0,'
    b'"mem_util_pct":0.0,"fb_used_mib":0.0,"fb_total_mib":81559.0,"power_w":0.0,"temp_c":0.0,'
    b'"lost":false,"processes":[],"error":"","dcgm":null}]}}],"watermark":17,"inputs":{},'
    b'"processed":17,"pruned":17,"last_xid":{},"last_telemetry":null,"findings":[],"counters":{"events":0,'
    b'"duplicates":0,"late_dropped":0,"samples":0,"device_samples":0,"unattributed_samples":0,'
    b'"ambiguous_joins":0,"input_stalls":0,"unaligned":0},"pub_gpus":{"GPU-":["","GPU-","NVIDIA ",0,[],'
    b'"exclusive",0.0,0.0,81559.0,0.0,0.0,[["","","","",""]],null,17,false,17,[]]}}}'
    b'{"format":1,"node":"","seq":1,"pods":["-4000-8000-"],'
    b'{"format":1,"node":"","uid":"","seq":1,"rows":{"rows":[{"uid":"","ns":"","pod":"","c":"","dev":"GPU-",'
    b'"gpu":"GPU-","mig":null,"first":17,"last":17,"sample":17,"active":true,'
    b'"src":["checkpoint","podresources","process"],"usage":{"util_pct":0.0,"fb_used_mib":0.0,'
    b'"power_w":0.0,"sharing":"exclusive","share_basis":"exclusive","gpu_fraction":1.0,'
    b'"seen_processes":true,"dcgm":null,"util_from_dcgm":false},"win":[17,0,0,0,0,0],"pub":-1,'
    b'"iwin":[],"low":0,"idle":false,"idle_since":0,"avg":0.0,"led":[17,0,0,0,0,0,0,0,1],"lowg":0,'
    b'"ib":false,"chg":[1,"exclusive",0,1]}],"pub":["","","","",[["","GPU-","GPU-","exclusive",'
    b'"exclusive",null,0.0,0.0,0.0,true,false,17,17,["checkpoint","podresources","process"],0,0.0,0.0,'
    b'1.0,[],17,"",null,null,null,null]],"","","Running",17,0,17]},"prev_seq":null,"prev":null}'
)
_DICTS = (_DICT_1,)  # oldest first: new records use the last
DICTIONARIES: dict[int, bytes] = {zlib.adler32(d): d for d in _DICTS}
_NEWEST = _DICTS[-1]


def pack(record: bytes) -> bytes:
    """`record` compressed with the newest dictionary."""
    c = zlib.compressobj(LEVEL, zdict=_NEWEST)
    return c.compress(record) + c.flush()


def unpack(data: bytes) -> bytes:
    """A packed record's bytes, with or without a dictionary (zlib.error if it is not one: corrupt,
    or compressed with a dictionary this version does not know)."""
    if len(data) >= 6 and data[1] & 0x20:  # FDICT: the DICTID follows the two header bytes
        zdict = DICTIONARIES.get(int.from_bytes(data[2:6], "big"))
        if zdict is None:
            raise zlib.error(f"needs dictionary {data[2:6].hex()}, which this version does not have")
        d = zlib.decompressobj(zdict=zdict)
        out = d.decompress(data) + d.flush()
        if not d.eof:
            raise zlib.error("incomplete or truncated stream")
        return out
    return zlib.decompress(data)
