#!/usr/bin/env python3
"""Helpers of tests/cli/convert.sh, independent of coc: numpy and the standard library only.

  hf_llama.py make DIR [--layers L --hidden H --heads A --kv-heads G --ffn F --vocab V --seed S]
      a random LLaMA-layout model with Hugging Face names: DIR/config.json and DIR/model.safetensors (F32)
  hf_llama.py logits DIR IDS OUT.npy
      the Hugging Face LLaMA forward (modeling_llama.py's math, in float64) of the comma-separated token ids
  hf_llama.py compare OUT.npy COC_LOGITS.bin TOL
      coc's --logits-out file (fp32 [tokens, vocab]) against the reference: max |difference| <= TOL
  hf_llama.py same DIR_A DIR_B
      every tensor of the two models equal bit for bit, and the same shape fields in config.json
  hf_llama.py rounded DIR_F32 DIR DTYPE
      every tensor of DIR is stored as DTYPE (F32, BF16 or F16) and holds DIR_F32's fp32 values rounded to nearest
      even in that type (bf16: the upper 16 bits after adding 0x7fff + the lowest kept bit; f16: numpy's astype),
      bit for bit; DIR's config.json says the matching torch_dtype
  hf_llama.py shard COC_SHARD HF_DIR|- TP RANK
      a coc checkpoint shard opens as a safetensors file; its metadata has coc's fields; its embedding rows are the
      Hugging Face embedding's rows of that TP rank (unless HF_DIR is -)
  hf_llama.py drop DIR NAME
      rewrites DIR/model.safetensors without tensor NAME
  hf_llama.py set DIR KEY JSON_VALUE
      sets one field of DIR/config.json

The safetensors reader and writer follow the format's description: u64 little-endian header length N, N bytes of
JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data.
"""
import json
import os
import struct
import sys

import numpy as np

# numpy has no bfloat16: BF16 tensors are read as their uint16 bits (and widened to float32 unless bits are asked for).
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "I32": np.int32,
          "I64": np.int64}
TORCH_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def bf16_bits(a):
    """The bfloat16 bits of float32 array a, round to nearest even (no NaN in these models)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_safetensors(path, bits=False):
    """(tensors, metadata, dtypes) of a safetensors file; BF16 tensors widened to float32 unless bits."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors, dtypes, end = {}, {}, 0
    for name, t in header.items():
        b, e = t["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        assert arr.nbytes == e - b, name
        if t["dtype"] == "BF16" and not bits:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        tensors[name], dtypes[name] = arr, t["dtype"]
        end = max(end, e)
    assert end == len(data), f"{path}: the data is {len(data)} bytes but the tensors end at {end}"
    return tensors, meta, dtypes


def write_safetensors(path, tensors, meta=None):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    if meta:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make(d, layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=256, seed=0):
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 64,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "attention_bias": False, "torch_dtype": "float32"}

    def w(*s):
        return (rng.standard_normal(s) * 0.1).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = w(hidden, hidden)
        t[p + "self_attn.k_proj.weight"] = w(kv_heads * hd, hidden)
        t[p + "self_attn.v_proj.weight"] = w(kv_heads * hd, hidden)
        t[p + "self_attn.o_proj.weight"] = w(hidden, hidden)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = w(ffn, hidden)
        t[p + "mlp.up_proj.weight"] = w(ffn, hidden)
        t[p + "mlp.down_proj.weight"] = w(hidden, ffn)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = w(vocab, hidden)
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(f"{d}/model.safetensors", t, {"format": "pt"})


def logits(d, ids):
    cfg = json.load(open(f"{d}/config.json"))
    t = read_safetensors(f"{d}/model.safetensors")[0]
    t = {k: v.astype(np.float64) for k, v in t.items()}
    H, A, G = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, theta = H // A, cfg["rms_norm_eps"], cfg["rope_theta"]
    S = len(ids)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    freqs = np.outer(np.arange(S), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]

    def rope(x):  # x [S, heads, D]; rotate_half
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return x * cos + np.concatenate([-x2, x1], axis=-1) * sin

    x = t["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((S, S), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, t[p + "input_layernorm.weight"])
        q = rope((h @ t[p + "self_attn.q_proj.weight"].T).reshape(S, A, D))
        k = rope((h @ t[p + "self_attn.k_proj.weight"].T).reshape(S, G, D))
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(S, G, D)
        k, v = np.repeat(k, A // G, axis=1), np.repeat(v, A // G, axis=1)  # repeat_kv
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D) + mask
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", pr, v).reshape(S, H)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, t[p + "post_attention_layernorm.weight"])
        g, u = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[p + "mlp.down_proj.weight"].T
    return rms(x, t["model.norm.weight"]) @ t["lm_head.weight"].T


def rounded(src, d, dtype):
    a = read_safetensors(f"{src}/model.safetensors")[0]
    b, _, dtypes = read_safetensors(f"{d}/model.safetensors", bits=True)
    assert sorted(a) == sorted(b), f"different tensor names: {sorted(set(a) ^ set(b))}"
    for k in a:
        if dtypes[k] != dtype:
            print(f"tensor {k} is stored as {dtypes[k]}, not {dtype}")
            return 1
        want = {"F32": lambda x: x, "BF16": bf16_bits, "F16": lambda x: x.astype(np.float16)}[dtype](a[k])
        if b[k].shape != want.shape or b[k].tobytes() != want.tobytes():
            print(f"tensor {k} is not the {dtype} rounding of the fp32 values")
            return 1
    torch_dtype = json.load(open(f"{d}/config.json"))["torch_dtype"]
    if torch_dtype != TORCH_DTYPES[dtype]:
        print(f"config.json says torch_dtype {torch_dtype}, not {TORCH_DTYPES[dtype]}")
        return 1
    print(f"{len(a)} tensors stored as {dtype}, each the round-to-nearest-even of the fp32 values")
    return 0


def main(argv):
    cmd = argv[1]
    if cmd == "make":
        opts = dict(zip(argv[3::2], argv[4::2]))
        make(argv[2], **{k.lstrip("-").replace("-", "_"): int(v) for k, v in opts.items()})
    elif cmd == "logits":
        np.save(argv[4], logits(argv[2], [int(i) for i in argv[3].split(",")]))
    elif cmd == "compare":
        ref = np.load(argv[2])
        got = np.fromfile(argv[3], dtype=np.float32).reshape(ref.shape)
        diff = float(np.max(np.abs(got - ref)))
        print(f"max |coc - numpy| = {diff:.3g} over {ref.size} logits (max |logit| {np.max(np.abs(ref)):.3g})")
        return 0 if diff <= float(argv[4]) else 1
    elif cmd == "same":
        a = read_safetensors(f"{argv[2]}/model.safetensors")[0]
        b = read_safetensors(f"{argv[3]}/model.safetensors")[0]
        if sorted(a) != sorted(b):
            print("different tensor names:", sorted(set(a) ^ set(b)))
            return 1
        for k in a:
            if a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes():
                print("tensor differs:", k)
                return 1
        ca, cb = json.load(open(f"{argv[2]}/config.json")), json.load(open(f"{argv[3]}/config.json"))
        for k in ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta"]:
            if ca[k] != cb[k]:
                print("config differs:", k, ca[k], cb[k])
                return 1
        print(f"{len(a)} tensors equal bit for bit")
    elif cmd == "rounded":
        return rounded(argv[2], argv[3], argv[4])
    elif cmd == "shard":
        t, meta, _ = read_safetensors(argv[2])
        hf = None if argv[3] == "-" else read_safetensors(f"{argv[3]}/model.safetensors")[0]
        tp, r = int(argv[4]), int(argv[5])
        for k in ["format", "iteration", "config_hash", "tp_rank", "tp_size", "meta", "coc_crc32"]:
            assert k in meta, f"metadata lacks {k}: {sorted(meta)}"
        assert meta["format"] == "coc" and meta["tp_rank"] == str(r) and meta["tp_size"] == str(tp), meta
        assert "mesh" in json.loads(meta["meta"]), meta["meta"]
        if argv[3] == "-":
            print(f"{argv[2]}: {len(t)} tensors, metadata {sorted(meta)}")
            return 0
        emb = hf["model.embed_tokens.weight"]
        V = emb.shape[0]
        begin = r * (V // tp) + min(r, V % tp)
        rows = V // tp + (1 if r < V % tp else 0)
        assert t["embedding.weight"].tobytes() == emb[begin:begin + rows].tobytes(), "embedding rows differ"
        print(f"{argv[2]}: {len(t)} tensors, metadata {sorted(meta)}")
    elif cmd == "drop":
        t, meta, _ = read_safetensors(f"{argv[2]}/model.safetensors")
        del t[argv[3]]
        write_safetensors(f"{argv[2]}/model.safetensors", t, meta)
    elif cmd == "set":
        cfg = json.load(open(f"{argv[2]}/config.json"))
        cfg[argv[3]] = json.loads(argv[4])
        with open(f"{argv[2]}/config.json", "w") as f:
            json.dump(cfg, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
