"""Plain-PyTorch twins of paramshard's DCNv2, XDeepFM, AutoInt and DIN, written from the papers and
not from paramshard's code: their own parameter layout (a Linear per cross layer, a [H, H', F]
CIN tensor, W_Q/W_K/W_V/W_Res per layer, heads in a loop), their own lookups. ``copy_from``
copies a paramshard model's weights in (the same init), naming each pairing, so equal outputs
and equal training show the two compute the same thing.

The tables are handed in (``wide`` dim 1, ``deep``): any EmbeddingBag-like module; ``twin_of``
gives copies of the model's (plain EmbeddingBags in a unit test, benchmarks/plain_torch_ctr.py's
local ones when trained)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


class Twin(nn.Module):
    """The pieces every CTR model here has: the field lookups, the linear (LR) logit, an MLP."""

    def __init__(self, wide, deep, num_dense: int, num_fields: int, mlp_in: int, hidden, final: bool):
        super().__init__()
        self.wide, self.deep, self.num_dense, self.num_fields = wide, deep, num_dense, num_fields
        self.dense_linear = nn.Linear(num_dense, 1, bias=False) if num_dense else None
        self.bias = nn.Parameter(torch.zeros(1))
        widths = [mlp_in] + [int(h) for h in hidden] + ([1] if final else [])
        self.tower = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.final = final

    def fields(self, table, ids, offsets, weights):
        batch = ids.shape[0] if offsets is None else offsets.shape[0] // self.num_fields
        if offsets is None:
            flat = ids.reshape(-1, 1)
            return table(flat).reshape(batch, self.num_fields, -1)
        return table(ids, offsets, per_sample_weights=weights).reshape(batch, self.num_fields, -1)

    def linear(self, dense, ids, offsets, weights):
        out = self.fields(self.wide, ids, offsets, weights).sum(dim=(1, 2)) + self.bias
        return out + self.dense_linear(dense)[:, 0] if self.dense_linear is not None else out

    def run_tower(self, x):
        for i, layer in enumerate(self.tower):
            x = layer(x)
            if not (self.final and i == len(self.tower) - 1):
                x = torch.relu(x)
        return x

    def copy_common(self, model):
        """The wide part and the MLP: paramshard's dense_wide (a Linear, or a bare bias) and mlp.*."""
        if self.dense_linear is not None:
            self.dense_linear.weight.copy_(model.dense_wide.weight)
        self.bias.copy_(model.dense_wide.bias)
        theirs = [m for m in (model.mlp or []) if isinstance(m, nn.Linear)]     # AutoInt's may be None
        assert len(theirs) == len(self.tower)
        for mine, other in zip(self.tower, theirs):
            mine.weight.copy_(other.weight)
            mine.bias.copy_(other.bias)


class TwinDCNv2(Twin):
    """x_{l+1} = x0 * (W_l x_l + b_l) + x_l (W = U V^T when rank > 0); parallel or stacked MLP."""

    def __init__(self, wide, deep, num_dense, num_fields, dim, cross_layers, hidden, rank, structure):
        d = num_fields * dim + num_dense
        super().__init__(wide, deep, num_dense, num_fields, d, hidden, final=False)
        self.rank, self.structure = rank, structure
        if rank:
            self.v = nn.ModuleList(nn.Linear(d, rank, bias=False) for _ in range(cross_layers))   # V^T x
            self.u = nn.ModuleList(nn.Linear(rank, d) for _ in range(cross_layers))              # U (.) + b
        else:
            self.w = nn.ModuleList(nn.Linear(d, d) for _ in range(cross_layers))                 # W x + b
        top = hidden[-1] if hidden else d
        self.out = nn.Linear(d + top if structure == "parallel" else top, 1)

    @torch.no_grad()
    def copy_from(self, model):
        self.copy_common(model)
        for layer in range(len(model.cross_b)):
            if self.rank:
                self.v[layer].weight.copy_(model.cross_v[layer].T)
                self.u[layer].weight.copy_(model.cross_u[layer])
                self.u[layer].bias.copy_(model.cross_b[layer])
            else:
                self.w[layer].weight.copy_(model.cross_w[layer])
                self.w[layer].bias.copy_(model.cross_b[layer])
        self.out.weight.copy_(model.head.weight)
        self.out.bias.copy_(model.head.bias)
        return self

    def forward(self, dense, ids, offsets=None, weights=None):
        x0 = torch.cat([self.fields(self.deep, ids, offsets, weights).flatten(1), dense], dim=1)
        x = x0
        for layer in range(len(self.v if self.rank else self.w)):
            wx = self.u[layer](self.v[layer](x)) if self.rank else self.w[layer](x)
            x = x0 * wx + x
        if self.structure == "parallel":
            top = torch.cat([x, self.run_tower(x0)], dim=1)
        else:
            top = self.run_tower(x)
        return self.linear(dense, ids, offsets, weights) + self.out(top)[:, 0]


class TwinXDeepFM(Twin):
    """CIN: X_l[h] = sum_{i,j} W_l[h, i, j] X_{l-1}[i] * X0[j] + b_l[h], sum-pooled over the
    embedding; with split_half, the first half of a layer's maps goes on, the second half out."""

    def __init__(self, wide, deep, num_dense, num_fields, dim, hidden, cin_layers, split_half):
        super().__init__(wide, deep, num_dense, num_fields, num_fields * dim + num_dense, hidden, final=True)
        self.split_half = split_half
        self.cin_w, self.cin_b = nn.ParameterList(), nn.ParameterList()
        rows, pooled = num_fields, 0
        for i, h in enumerate(cin_layers):
            self.cin_w.append(nn.Parameter(torch.zeros(h, rows, num_fields)))
            self.cin_b.append(nn.Parameter(torch.zeros(h)))
            halve = split_half and i < len(cin_layers) - 1
            rows = h // 2 if halve else h
            pooled += h // 2 if halve else h
        self.cin_out = nn.Linear(pooled, 1)

    @torch.no_grad()
    def copy_from(self, model):
        self.copy_common(model)
        for w, b, conv in zip(self.cin_w, self.cin_b, model.cin.convs):
            # the conv's input channel i * F + j is the product of map i and field j
            w.copy_(conv.weight[:, :, 0].reshape(w.shape))
            b.copy_(conv.bias)
        self.cin_out.weight.copy_(model.cin_head.weight)
        self.cin_out.bias.copy_(model.cin_head.bias)
        return self

    def forward(self, dense, ids, offsets=None, weights=None):
        x0 = self.fields(self.deep, ids, offsets, weights)                  # [B, F, k]
        x, pooled = x0, []
        for i, (w, b) in enumerate(zip(self.cin_w, self.cin_b)):
            maps = torch.einsum("hij,bik,bjk->bhk", w, x, x0) + b[None, :, None]
            if self.split_half and i < len(self.cin_w) - 1:
                half = maps.shape[1] // 2
                x, out = maps[:, :half], maps[:, half:]
            else:
                x = out = maps
            pooled.append(out.sum(dim=2))
        cin = self.cin_out(torch.cat(pooled, dim=1))[:, 0]
        deep = self.run_tower(torch.cat([x0.flatten(1), dense], dim=1))[:, 0]
        return self.linear(dense, ids, offsets, weights) + cin + deep


class TwinAutoInt(Twin):
    """Per layer and head h: alpha = softmax_k(<W_Q^h e_m, W_K^h e_k>), e~_m^h = sum_k alpha W_V^h e_k;
    e_m <- ReLU(concat_h e~_m^h + W_Res e_m)."""

    def __init__(self, wide, deep, num_dense, num_fields, dim, hidden, attention_layers, heads, head_dim):
        super().__init__(wide, deep, num_dense, num_fields, num_fields * dim + num_dense, hidden, final=True)
        self.heads, self.head_dim, self.has_tower = heads, head_dim, bool(hidden)
        if not hidden:
            self.tower = nn.ModuleList()        # the plain AutoInt: no MLP at all
        width = heads * head_dim
        self.q, self.k, self.v, self.res = (nn.ModuleList(nn.Linear(dim if i == 0 else width, width, bias=False)
                                                          for i in range(attention_layers)) for _ in range(4))
        self.out = nn.Linear(num_fields * width, 1)

    @torch.no_grad()
    def copy_from(self, model):
        self.copy_common(model)
        width = self.heads * self.head_dim
        for layer, theirs in enumerate(model.attention):
            for part, mine in enumerate((self.q, self.k, self.v, self.res)):   # Q, K, V, Res: the Linear's row blocks
                mine[layer].weight.copy_(theirs.qkvr.weight[part * width:(part + 1) * width])
        self.out.weight.copy_(model.attention_head.weight)
        self.out.bias.copy_(model.attention_head.bias)
        return self

    def forward(self, dense, ids, offsets=None, weights=None):
        v0 = self.fields(self.deep, ids, offsets, weights)                  # [B, F, dim]
        e = v0
        for q, k, v, res in zip(self.q, self.k, self.v, self.res):
            Q, K, V = q(e), k(e), v(e)
            heads = []
            for h in range(self.heads):
                part = slice(h * self.head_dim, (h + 1) * self.head_dim)
                alpha = torch.softmax(torch.einsum("bmd,bkd->bmk", Q[..., part], K[..., part]), dim=2)
                heads.append(torch.einsum("bmk,bkd->bmd", alpha, V[..., part]))
            e = torch.relu(torch.cat(heads, dim=2) + res(e))
        out = self.linear(dense, ids, offsets, weights) + self.out(e.flatten(1))[:, 0]
        if self.has_tower:
            out = out + self.run_tower(torch.cat([v0.flatten(1), dense], dim=1))[:, 0]
        return out


class TwinDIN(Twin):
    """Row by row: the sequence's last max_len ids, each looked up alone; per position
    a = Linear(PReLU(...Linear([e_s, e_c, e_s - e_c, e_s * e_c]))) (no softmax); the sequence's
    vector sum_p a_p e_p replaces its field; MLP with PReLU over [fields, dense]."""

    def __init__(self, wide, deep, num_dense, num_fields, dim, hidden, attention_hidden, pairs, max_len):
        super().__init__(wide, deep, num_dense, num_fields, num_fields * dim + num_dense, hidden, final=True)
        self.pairs, self.max_len = pairs, max_len
        self.tower_act = nn.ModuleList(nn.PReLU() for _ in hidden)
        self.unit = nn.ModuleList()
        for _ in pairs:
            widths = [4 * dim] + list(attention_hidden) + [1]
            self.unit.append(nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:])))
        self.unit_act = nn.ModuleList(nn.ModuleList(nn.PReLU() for _ in attention_hidden) for _ in pairs)

    @torch.no_grad()
    def copy_from(self, model):
        self.copy_common(model)
        for mine, theirs in zip(self.tower_act, [m for m in model.mlp if isinstance(m, nn.PReLU)], strict=True):
            mine.weight.copy_(theirs.weight)
        for k, unit in enumerate(model.attention):
            linears = [m for m in unit.mlp if isinstance(m, nn.Linear)]
            for mine, theirs in zip(self.unit[k], linears, strict=True):
                mine.weight.copy_(theirs.weight)
                mine.bias.copy_(theirs.bias)
            for mine, theirs in zip(self.unit_act[k], [m for m in unit.mlp if isinstance(m, nn.PReLU)], strict=True):
                mine.weight.copy_(theirs.weight)
        return self

    def bag_ids(self, ids, offsets, row, field):
        if offsets is None:
            return ids[row, field:field + 1]
        k = row * self.num_fields + field
        end = offsets[k + 1] if k + 1 < len(offsets) else len(ids)
        return ids[offsets[k]:end]

    def attend(self, k, seq_ids, cand):
        seq_ids = seq_ids[-self.max_len:]                               # the most recent
        e = self.deep(seq_ids.reshape(-1, 1))                          # [L, dim], one lookup per id
        x = torch.cat([e, cand.expand_as(e), e - cand, e * cand], dim=1)
        for i, layer in enumerate(self.unit[k]):
            x = layer(x)
            if i < len(self.unit_act[k]):
                x = self.unit_act[k][i](x)
        return (x * e).sum(dim=0)                                       # weights as they are: no softmax

    def forward(self, dense, ids, offsets=None, weights=None):
        v = self.fields(self.deep, ids, offsets, weights)              # [B, F, dim]
        rows = []
        for b in range(v.shape[0]):
            parts = list(v[b])
            for k, (s, c) in enumerate(self.pairs):
                parts[s] = self.attend(k, self.bag_ids(ids, offsets, b, s), v[b, c])
            rows.append(torch.cat(parts))
        x = torch.cat([torch.stack(rows), dense], dim=1)
        for i, layer in enumerate(self.tower):
            x = layer(x)
            if i < len(self.tower_act):
                x = self.tower_act[i](x)
        return self.linear(dense, ids, offsets, weights) + x[:, 0]


def twin_of(model):
    """The twin of a paramshard model, with copies of its tables and its weights copied in."""
    name = type(model).__name__
    common = (copy.deepcopy(model.wide), copy.deepcopy(model.deep), model.num_dense, model.num_fields, model.dim)
    if name == "DCNv2":
        twin = TwinDCNv2(*common, model.cross_layers, model.hidden, model.rank, model.structure)
    elif name == "XDeepFM":
        twin = TwinXDeepFM(*common, model.hidden, model.cin.layers, model.cin.split_half)
    elif name == "AutoInt":
        twin = TwinAutoInt(*common, model.hidden, model.attention_layers, model.heads, model.head_dim)
    elif name == "DIN":
        twin = TwinDIN(*common, model.hidden, model.attention_hidden, model.pairs, model.max_len)
    else:
        raise ValueError(f"no twin for {name}")
    return twin.copy_from(model)


def assert_same_logits_and_gradients(model, twin, inputs, label: str) -> None:
    """The model and its twin (built by twin_of(model)) give the same logits on ``inputs`` and,
    after one backward pass of the same upstream gradient, the same gradient for every
    parameter (the model's gradients moved into the twin's layout the way its values are)."""
    logits, expected = model(*inputs), twin(*inputs)
    assert logits.shape == (inputs[0].shape[0],) and logits.abs().max() > 0.1     # not a vanishing output
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-6)
    upstream = torch.randn(logits.shape[0])
    (logits * upstream).sum().backward()
    (expected * upstream).sum().backward()
    grads = copy.deepcopy(model)
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads.parameters(), strict=True):
            g.copy_(p.grad)
    want = twin_of(grads)
    for (n, p), w in zip(twin.named_parameters(), want.parameters(), strict=True):
        assert p.grad is not None, n
        torch.testing.assert_close(p.grad, w, atol=1e-6, rtol=1e-5, msg=lambda m: f"{label} {n}: {m}")
