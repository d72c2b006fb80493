"""Disaggregated serving: sibling instances, what crosses between them, remote prefill/encode.

The wire formats (sibling_wire, kv_wire, embed_wire) are plain bytes and JSON; the HTTP clients
(siblings, remote_prefill, remote_encode, kv_follow) are the package's edge and the only engine
modules that speak HTTP.
"""
