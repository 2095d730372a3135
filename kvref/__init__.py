"""A literate reference implementation of vLLM V1's core, and a correctness oracle for engines, routers and kernels

Modules:

- `kvref.adapters.field`: NVIDIA Dynamo's KV router index and kvcached's prefix-cache pool held to vLLM 0.33's contract by kvref's own checks, what each release answered where it differs, and a short check of SGLang and LMCache."""

__version__ = "0.0.1"
