#!/usr/bin/python3
"""Projects a token-anchored translator's anchor weights onto a shared rank-r
basis of the anchor table's width, and writes the result as a translator file
of the same format (each A = A·Pᵀ·P, full size again, so that today's loader
and `kvl eval-translator` read it unchanged).

P [r, E] is the rank-r input map that best keeps every anchor weight's output
over the table's rows (all layers, keys and values, all W offsets stacked;
derivation in main()). With it the anchors factor as table·Pᵀ ([V, r], shared by every
layer and offset) times per-(layer, offset) maps [H_t*D_t, r]: memory V·r +
2·L·W·H_t·D_t·r instead of the V·W·2·L·H_t·D_t lookup.

  experiments/lowrank_anchors/project.py IN.safetensors OUT.safetensors RANK [optimal|pca]

optimal (default): P from the anchors themselves (needs the full-rank fit
first); pca: P = the table's top r principal directions (its right singular
vectors), which needs no fit, so a translator could be fitted at rank r from
the start (A' = A·PᵀP is then a lower bound on what such a fit reaches).
Prints the share of the anchor outputs' squared norm over the table the rank keeps.
"""
import json
import struct
import sys

import numpy as np


def read(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    meta = header.pop('__metadata__', None)
    tensors = {}
    for name, info in header.items():
        assert info['dtype'] == 'F32', (name, info['dtype'])
        lo, hi = info['data_offsets']
        tensors[name] = np.frombuffer(body[lo:hi], dtype='<f4').reshape(info['shape']).copy()
    return meta, tensors


def write(path, meta, tensors):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype='<f4').tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(tensors[name].shape),
                        'data_offsets': [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if meta is not None:
        header['__metadata__'] = meta
    text = json.dumps(header, separators=(',', ':')).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def main():
    src, dst, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else 'optimal'
    assert mode in ('optimal', 'pca'), mode
    meta, t = read(src)
    table = t['anchor.table']
    e = table.shape[1]
    names = sorted(n for n in t if n.endswith('.anchor'))
    # Each anchor [HD, W*E] as W blocks [HD, E]: rows of one stack.
    blocks = []
    for n in names:
        a = t[n]
        w = a.shape[1] // e
        blocks += [a[:, k * e:(k + 1) * e] for k in range(w)]
    stack = np.concatenate(blocks, axis=0).astype(np.float64)  # [R, E]
    # The rank-r map that best keeps what the anchors add over the table's
    # rows: with table = U S Vᵀ, table·Aᵀ = U·M for M = S Vᵀ Aᵀ [E, R], whose
    # best rank-r approximation is L Lᵀ M (L: M's top r left singular
    # vectors). So A' = A·Qᵀ with Q = V S⁻¹ L Lᵀ S Vᵀ (an oblique projector
    # of rank r), and P = Lᵀ S⁻¹ Vᵀ [r, E]: table·Pᵀ = U·L.
    _, sv, vt = np.linalg.svd(table.astype(np.float64), full_matrices=False)
    keep = sv > sv[0] * 1e-6
    sv, vt = sv[keep], vt[keep]
    m = (sv[:, None] * vt) @ stack.T  # [E', R]
    l, s, _ = np.linalg.svd(m, full_matrices=False)
    if mode == 'optimal':
        l = l[:, :rank]
        q = vt.T @ np.diag(1 / sv) @ l @ l.T @ np.diag(sv) @ vt  # [E, E]
    else:
        q = vt[:rank].T @ vt[:rank]  # the orthogonal projector on the table's top r
    # The share of table·Aᵀ's squared norm that table·Qᵀ·Aᵀ keeps.
    full = np.linalg.norm(m) ** 2
    kept = 1 - np.linalg.norm((sv[:, None] * vt) @ (np.eye(e) - q) @ stack.T) ** 2 / full
    for n in names:
        a = t[n].astype(np.float64)
        w = a.shape[1] // e
        t[n] = np.concatenate([a[:, k * e:(k + 1) * e] @ q.T for k in range(w)],
                              axis=1).astype(np.float32)
    write(dst, meta, t)
    print(f'{src} rank {rank}/{e} ({mode}): keeps {kept:.4f} of the anchor outputs\' squared norm '
          f'over the table -> {dst}')


if __name__ == '__main__':
    main()
