"""``ng-transformer``'s backbone: the relational transformer on the neural graph.

The reference code's ``RelationalTransformer`` (``RTLayer``, ``RTAttention`` with ``modulate_v=True``,
``EdgeLayer``). Every node attends to every node; for the pair (query ``i``, key ``j``) the edge
feature ``e_ij`` enters the query, the key and the value:

    q_ij = W_q x_i + Q e_ij,   k_ij = W_k x_j + K e_ij,   v_ij = (W_v x_j) * M e_ij + V e_ij,
    x_i <- sum_j softmax_j(q_ij . k_ij / sqrt(d_attn)) v_ij        (per head)

``e_ij`` is the state of the forward edge when ``j`` is in the layer after ``i``'s, of the reverse
edge when it is in the layer before, and for every other pair (same layer, non-consecutive layers,
``i`` itself) the feature of a zero weight, which is not updated: the code holds and updates a state
for each of the ``N^2`` pairs, here only the network's edges have states (dense per layer pair, so
a 784-input classifier fits in memory). Node update: ``LN(x + lin0(attn))``, ``LN(x + MLP(x))``;
edge update: ``LN(e + MLP(e_ij, e_ji, x_i, x_j))``, ``LN(e + MLP(e))`` (none after the last layer).
Linear maps start Xavier-uniform with zero biases (the code's ``Linear``).
"""

from __future__ import annotations

import torch
from torch import nn

from dws.ng.graph import LayeredGraph, edge_sum
from dws.ops.linear import Linear, linear

Tensor = torch.Tensor


def xavier_linear(in_features: int, out_features: int, bias: bool = True, per_edge: bool = False) -> nn.Linear:
    """The code's ``Linear``; ``per_edge``: a map of every edge's features, by :func:`dws.ops.linear.linear`."""
    m = (Linear if per_edge else nn.Linear)(in_features, out_features, bias)
    nn.init.xavier_uniform_(m.weight)
    if bias:
        nn.init.zeros_(m.bias)
    return m


def per_head_sum(a: Tensor, values: Tensor) -> Tensor:
    """``y[..., h, :] = sum_j a[..., h, j] values[..., j, h, :]``: ``a`` ``[..., H, m]``, ``values``
    ``[..., m, H, h]`` -> ``[..., H, h]``. One matmul of every head's weights with all ``H * h`` channels,
    of which head ``h``'s own are kept (``H`` times the products needed, still a small matmul): ``values``
    and its gradient stay in their stored layout, where a per-head product (``einsum``) copies both
    into ``[..., H, m, h]``."""
    every = torch.matmul(a, values.flatten(-2)).unflatten(-1, (values.shape[-2], -1))  # [..., H, H, h]
    return every.diagonal(dim1=-3, dim2=-2).transpose(-1, -2)


class HeadDot(torch.autograd.Function):
    """``torch.linalg.vecdot(a, b)`` of two real ``[..., H, h]`` tensors of one shape (each head's dot products).
    In bfloat16 the backward expands the gradient over the ``h`` channels once, contiguously, for both products:
    multiplied in broadcast along the innermost axis (autograd's way, kept for float32, where it is vectorized)
    it runs one element at a time on CPUs (a bfloat16 vector holds 32 values, a head 16), ~10x slower
    (docs/dws.md, "Speed under bf16")."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return torch.linalg.vecdot(a, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        grad = grad[..., None]
        if grad.dtype == torch.bfloat16:
            grad = grad.expand_as(a).contiguous()
        return (grad * b if ctx.needs_input_grad[0] else None), (grad * a if ctx.needs_input_grad[1] else None)


class RelationalAttention(nn.Module):
    """Multi-head attention over all nodes with edge-conditioned queries, keys and values."""

    def __init__(self, node_channels: int, edge_channels: int, hidden: int, heads: int):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"attention width {hidden} is not a multiple of {heads} heads")
        self.heads, self.scale = heads, hidden ** -0.5
        self.qkv_node = xavier_linear(node_channels, 3 * hidden, bias=False)
        self.qkv_edge = xavier_linear(edge_channels, 4 * hidden, bias=False)  # Q, K, V and M of the docstring
        self.proj_out = xavier_linear(hidden, node_channels)

    def split(self, t: Tensor, parts: int) -> tuple[Tensor, ...]:
        """``[..., parts * hidden]`` -> ``parts`` tensors ``[..., heads, hidden / heads]``."""
        return t.unflatten(-1, (self.heads, -1)).chunk(parts, dim=-1)

    def edge_maps(self) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
        """``qkv_edge``'s rows split: ``Q``, ``K`` and ``M`` (``[hidden, E]`` each, head by head), each
        applied to every edge as a product of its own (one ``[3 * hidden]`` product split in three cost a
        copy of its whole gradient in the backward), and ``V`` as ``[H, h, E]``, which is applied to
        pooled edges, not to every edge."""
        q, k, v, m = self.qkv_edge.weight.unflatten(0, (self.heads, 4, -1)).unbind(1)
        return (q.flatten(0, 1), k.flatten(0, 1), m.flatten(0, 1)), v

    def forward(self, graph: LayeredGraph, no_edge: Tensor) -> list[Tensor]:
        x, L = graph.nodes, len(graph.nodes) - 1
        # per layer [B, d_l, H, h], contiguous: a strided view broadcast against the per-edge tensors below runs
        # one element at a time in bfloat16 (its rows of h = 16 values are shorter than a vector), ~6x slower
        q, k, v = ([t.contiguous() for t in qkv] for qkv in zip(*(self.split(self.qkv_node(x_l), 3) for x_l in x)))
        q0, k0, v0, m0 = self.split(self.qkv_edge(no_edge), 4)  # [H, h]
        edge_qkm, value = self.edge_maps()
        out = []
        for l in range(L + 1):
            others = [m for m in range(L + 1) if abs(m - l) != 1]
            keys = torch.cat([k[m] for m in others], dim=1) + k0
            others_values = torch.cat([v[m] for m in others], dim=1) * m0 + v0
            logits = [torch.einsum("bnhd,bmhd->bnmh", q[l] + q0, keys)]  # [B, d_l, d_m, H]: heads last, see below
            # (key layer, its edges as [B, d_l, d_m, E]): the reverse edges l -> l - 1 are stored so; the forward
            # ones l -> l + 1, stored [B, d_{l+1}, d_l, E], are transposed once here (E channels), so that every
            # per-edge tensor below is contiguous and no [B, d_l, d_m, H, h] tensor or gradient is ever permuted
            neighbours = ([(l - 1, graph.backward[l - 1])] if l > 0 else []) + \
                         ([(l + 1, graph.forward[l].transpose(1, 2).contiguous())] if l < L else [])
            values = []
            for m, e in neighbours:  # query l, key m
                qe, ke, me = (linear(e, w).unflatten(-1, (self.heads, -1)) for w in edge_qkm)  # [B, d_l, d_m, H, h]
                logits.append(HeadDot.apply(q[l][:, :, None] + qe, k[m][:, None] + ke))
                values.append(v[m][:, None] * me)  # its V e term is added below
            # softmax over the keys in [B, d_l, N, H]: the logits' gradients then reach HeadDot in its own layout,
            # and so qe's and ke's in theirs (in [B, H, d_l, N] they came back permuted, and were copied)
            attention = torch.softmax(torch.cat(logits, dim=2) * self.scale, dim=2)
            parts = attention.split([t.shape[2] for t in logits], dim=2)
            y = torch.einsum("bnmh,bmhd->bnhd", parts[0], others_values)
            for a, val, (_, e) in zip(parts[1:], values, neighbours):
                a = a.transpose(2, 3)  # [B, d_l, H, d_m]
                # sum_j a_ij V e_ij = V sum_j a_ij e_ij: the edges are pooled per head, then mapped once per node
                pooled = torch.matmul(a, e)  # [B, d_l, H, E]
                y = y + per_head_sum(a, val) + torch.einsum("bnhe,hde->bnhd", pooled, value)
            out.append(self.proj_out(y.flatten(-2)))
        return out


class EdgeUpdate(nn.Module):
    """``e = LN(e + lin1(GELU(lin_e([e, e_rev]) + lin_s(x_source) + lin_t(x_target))))``, then ``LN(e + MLP(e))``."""

    def __init__(self, node_channels: int, edge_channels: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.lin_e = xavier_linear(2 * edge_channels, hidden, per_edge=True)
        self.lin_s = xavier_linear(node_channels, hidden)
        self.lin_t = xavier_linear(node_channels, hidden)
        self.lin1 = xavier_linear(hidden, edge_channels, per_edge=True)
        self.mlp = nn.Sequential(xavier_linear(edge_channels, hidden, bias=False, per_edge=True), nn.GELU(),
                                 xavier_linear(hidden, edge_channels, per_edge=True), nn.Dropout(dropout))
        self.norm0, self.norm1 = nn.LayerNorm(edge_channels), nn.LayerNorm(edge_channels)
        self.act, self.dropout = nn.GELU(), nn.Dropout(dropout)

    def update(self, e: Tensor, e_rev: Tensor, lower: Tensor, upper: Tensor, reverse: bool) -> Tensor:
        h = edge_sum(self.lin_e, self.lin_s, self.lin_t, torch.cat([e, e_rev], dim=-1), lower, upper, reverse)
        e = self.norm0(e + self.dropout(self.lin1(self.act(h))))
        return self.norm1(e + self.mlp(e))

    def forward(self, graph: LayeredGraph) -> LayeredGraph:
        x, pairs = graph.nodes, list(zip(graph.forward, graph.backward))
        forward = [self.update(f, b, x[l], x[l + 1], False) for l, (f, b) in enumerate(pairs)]
        backward = [self.update(b, f, x[l], x[l + 1], True) for l, (f, b) in enumerate(pairs)]
        return graph.with_edges(forward, backward)


class RTLayer(nn.Module):
    """Attention and node MLP (residual, layer norm), then the edge update (``update_edges``)."""

    def __init__(self, node_channels: int, edge_channels: int, attention_hidden: int, node_hidden: int,
                 edge_hidden: int, heads: int, dropout: float = 0.0, update_edges: bool = True):
        super().__init__()
        self.attention = RelationalAttention(node_channels, edge_channels, attention_hidden, heads)
        self.lin0 = xavier_linear(node_channels, node_channels)
        self.mlp = nn.Sequential(xavier_linear(node_channels, node_hidden, bias=False), nn.GELU(),
                                 xavier_linear(node_hidden, node_channels), nn.Dropout(dropout))
        self.norm0, self.norm1 = nn.LayerNorm(node_channels), nn.LayerNorm(node_channels)
        self.dropout = nn.Dropout(dropout)
        self.edge_update = EdgeUpdate(node_channels, edge_channels, edge_hidden, dropout) if update_edges else None

    def forward(self, graph: LayeredGraph, no_edge: Tensor) -> LayeredGraph:
        attended = self.attention(graph, no_edge)
        nodes = [self.norm0(x + self.dropout(self.lin0(a))) for x, a in zip(graph.nodes, attended)]
        graph = graph.with_nodes([self.norm1(x + self.mlp(x)) for x in nodes])
        return graph if self.edge_update is None else self.edge_update(graph)
