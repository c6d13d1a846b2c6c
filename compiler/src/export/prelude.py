# ---------------------------------------------------------------------------------------------------
# Runtime helpers: the same in every module rlxc exports; the stage functions above call them.
#
# Values. A value at level `batch` is a 0-d tensor, `group` [G], `resp` [B], `pair` [B, B] (response i,
# other response j of the same group) and `tok` [B, T], padded: `L.tmask` marks the tokens that exist
# (`response_mask`). A feature axis adds a trailing dimension: `crit` [.., C] (padded, `L.cmask`), `dim`
# [.., D], a rubric [.., K], a matrix [.., R*C] (row-major). Shapes are written "level" or
# "level:feature" (a rubric as "name/K", a matrix as "ROWS*COLS", e.g. "dim*style/3").
#
# Padding. Reductions read only elements that exist. Padded elements of inputs (and of `shift`/`scan`
# results) hold a detached copy of a real element of the same row, so that no NaN or infinity arises
# there, forward or backward, and no gradient leaves them.
#
# Semantics (those of the rlx reference interpreter): a reduction over no element gives 0 (`var` and
# `std` too); `min`/`max` send the gradient to the first operand on ties; a reduced `max`/`min` sends
# it to every element equal to the result; `sqrt` has gradient 0 at 0; `floor`, `sign`, `lgamma`,
# comparisons and `count` pass none; `scan` passes none to its decay and `shift` none to its fill.
# ---------------------------------------------------------------------------------------------------


def _parse(shape):
    level, _, feature = shape.partition(":")
    return level, (feature or None)


class _Layout:
    """Where the elements of each level are: responses, groups, tokens, criteria."""

    def __init__(self, tmask, group_ids, crit_mask, dim, dtype, device, step, progress):
        self.dtype, self.device = dtype, device
        self.tmask = tmask  # [B, T] bool
        self.B, self.T = int(tmask.shape[0]), int(tmask.shape[1])
        self.group_ids = group_ids  # [B] long in 0..G-1 (every group non-empty), or None
        self.G = int(group_ids.max()) + 1 if group_ids is not None and group_ids.numel() else 0
        self.crit_mask = crit_mask  # [B, C] bool (the criteria of each response's group), or None
        self.C = int(crit_mask.shape[1]) if crit_mask is not None else 0
        self.D = dim
        self.step = self.scalar(step)
        self.progress = self.scalar(progress)
        self._cache = {}

    def scalar(self, value):
        return torch.as_tensor(value, dtype=self.dtype, device=self.device)

    def _cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # groups
    @property
    def ix(self):
        """The group of each response."""
        if self.group_ids is None:
            raise ValueError(
                f"recipe `{RECIPE}` groups responses by prompt here: pass `index` (the group of each "
                "response: an id per response, e.g. verl's `uid`) in the batch"
            )
        return self.group_ids

    @property
    def arange(self):
        return self._cached("arange", lambda: torch.arange(self.B, device=self.device))

    @property
    def n(self):
        """Responses per group."""
        return self._cached("n", lambda: torch.bincount(self.ix, minlength=self.G).to(self.dtype))

    @property
    def first_resp(self):
        """The first response of each group."""
        return self._cached(
            "first_resp",
            lambda: torch.full((self.G,), self.B, dtype=torch.long, device=self.device).scatter_reduce(
                0, self.ix, self.arange, reduce="amin", include_self=True
            ),
        )

    @property
    def pmask(self):
        """[B, B]: j is another response of i's group."""

        def make():
            same = self.ix[:, None] == self.ix[None, :]
            return same & ~torch.eye(self.B, dtype=torch.bool, device=self.device)

        return self._cached("pmask", make)

    @property
    def other_ix(self):
        """[B, B]: j where (i, j) is a pair, else a real other of i (or i itself), for padding."""

        def make():
            has = self.pmask.any(1)
            partner = torch.where(has, self.pmask.to(torch.int8).argmax(1), self.arange)
            return torch.where(self.pmask, self.arange[None, :], partner[:, None])

        return self._cached("other_ix", make)

    @property
    def resp_index(self):
        """Position of each response in its group."""

        def make():
            same = self.ix[:, None] == self.ix[None, :]
            earlier = self.arange[None, :] < self.arange[:, None]
            return (same & earlier).sum(1).to(self.dtype)

        return self._cached("resp_index", make)

    @property
    def cmask(self):
        """[G, C]: the criteria each group has."""
        return self._cached("cmask", lambda: self.crit_mask[self.first_resp])

    # tokens
    @property
    def length_long(self):
        return self._cached("length_long", lambda: self.tmask.sum(1))

    @property
    def length(self):
        return self._cached("length", lambda: self.length_long.to(self.dtype))

    @property
    def order(self):
        """Per row, the positions of existing tokens first (in order), then the padding."""
        return self._cached(
            "order",
            lambda: torch.argsort((~self.tmask).to(torch.int8), dim=1, stable=True),
        )

    @property
    def inv_order(self):
        return self._cached("inv_order", lambda: torch.argsort(self.order, dim=1))

    @property
    def token_index(self):
        def make():
            position = torch.cumsum(self.tmask.to(torch.long), 1) - 1
            return torch.where(self.tmask, position, 0).to(self.dtype)

        return self._cached("token_index", make)

    def shape(self, shape):
        level, feature = _parse(shape)
        dims = {
            "batch": (),
            "group": (self.G,),
            "resp": (self.B,),
            "pair": (self.B, self.B),
            "tok": (self.B, self.T),
        }[level]
        if feature is None:
            return dims
        if feature == "crit":
            return dims + (self.C,)
        if "*" in feature:
            rows, cols = (_axis_width(self, axis) for axis in feature.split("*"))
            return dims + (rows * cols,)
        return dims + (_axis_width(self, feature),)

    def subset(self, sel):
        """The layout of the responses `sel` alone, and the groups they keep."""
        kept_groups, group_ids = torch.unique(self.ix[sel], return_inverse=True)
        sub = _Layout(
            self.tmask[sel],
            group_ids,
            self.crit_mask[sel] if self.crit_mask is not None else None,
            self.D,
            self.dtype,
            self.device,
            self.step,
            self.progress,
        )
        return sub, kept_groups


def _axis_width(L, axis):
    """The length of a rectangular feature axis: `dim` or a rubric `name/K`."""
    return L.D if axis == "dim" else int(axis.rpartition("/")[2])


def _matrix_dim(feature, shape, level):
    """The `dim` length a matrix input of `shape` gives ([.., R, C] or flat [.., R*C]); 0 if none."""
    rows, cols = feature.split("*")
    if "dim" not in (rows, cols):
        return 0
    nested = len(shape) == (0 if level == "batch" else 1) + 2
    if nested:
        return int(shape[-2] if rows == "dim" else shape[-1])
    width = int(shape[-1]) if len(shape) else 0
    if rows == "dim" and cols == "dim":
        return math.isqrt(width)
    other = cols if rows == "dim" else rows
    return width // int(other.rpartition("/")[2])


def _spread(L, x, matrix, rows):
    """A vector [.., A] spread over a matrix `matrix` ("ROWS*COLS", flat row-major): y[a, b] = x[a]
    along the rows (`rows`), else y[a, b] = x[b] (`SpreadRows`, `SpreadCols`)."""
    r, c = (_axis_width(L, axis) for axis in matrix.split("*"))
    x = _t(L, x)
    lead = tuple(x.shape[:-1])
    y = x[..., :, None].expand(*lead, r, c) if rows else x[..., None, :].expand(*lead, r, c)
    return y.reshape(*lead, r * c)


def _contract(L, m, matrix, rows):
    """A matrix [.., R*C] summed over its rows (`rows`: y[b] = Σ_a m[a, b]) or its columns
    (y[a] = Σ_b m[a, b]) (`ContractRows`, `ContractCols`)."""
    r, c = (_axis_width(L, axis) for axis in matrix.split("*"))
    m = _t(L, m)
    lead = tuple(m.shape[:-1])
    return m.reshape(*lead, r, c).sum(-2 if rows else -1)


def _t(L, value):
    return value if torch.is_tensor(value) else L.scalar(value)


def _exists(L, shape):
    """A bool mask of the elements of `shape` that exist (broadcastable to it), or None if all do."""
    level, feature = _parse(shape)
    mask = None
    if level == "tok":
        mask = L.tmask
    elif level == "pair":
        mask = L.pmask
    if feature == "crit":
        if level == "group":
            crit = L.cmask
        elif level == "resp":
            crit = L.crit_mask
        else:
            crit = L.crit_mask[:, None, :]
        mask = crit if mask is None else mask[..., None] & crit
    elif feature is not None and mask is not None:
        mask = mask[..., None]
    return mask


def _up(L, x, src, dst):
    """Broadcast a value of shape `src` to the full layout of the finer shape `dst`."""
    src_level, src_feature = _parse(src)
    dst_level, dst_feature = _parse(dst)
    x = _t(L, x)
    if src_level == "group" and dst_level != "group":
        x = x[L.ix]
        src_level = "resp"
    if src_level == "resp" and dst_level in ("tok", "pair"):
        x = x[:, None]
    if dst_feature is not None and src_feature is None and src_level != "batch":
        x = x[..., None]
    return torch.broadcast_to(x, L.shape(dst))


def _expand(L, x, shape):
    """The operand (already laid out for `shape`) materialised at every element of `shape`."""
    return torch.broadcast_to(_t(L, x), L.shape(shape))


def _fill_tok(L, x):
    """Padding tokens take a detached copy of their row's first token (0 in an empty row)."""
    first = x.gather(1, L.order[:, :1]).detach() if L.T else x[:, :0]
    first = torch.where(L.length_long[:, None] > 0, first, torch.zeros_like(first))
    return torch.where(L.tmask, x, first)


def _fill_crit(L, x, level):
    """Criteria a group does not have take a detached copy of its first criterion (or 0)."""
    mask = L.cmask if level == "group" else L.crit_mask
    if mask.shape[1] == 0:
        return x
    first = torch.where(mask[:, :1], x[:, :1].detach(), torch.zeros_like(x[:, :1]))
    return torch.where(mask, x, first)


def _reduce_dim(x, dim, how):
    if how == "sum":
        return x.sum(dim)
    if x.shape[dim] == 0:
        shape = list(x.shape)
        del shape[dim]
        return x.new_full(shape, -math.inf if how == "amax" else math.inf)
    return x.amax(dim) if how == "amax" else x.amin(dim)


def _segment(L, x, how):
    """Per group, the sum / max / min of the responses' values."""
    shape = (L.G,) + tuple(x.shape[1:])
    if how == "sum":
        return x.new_zeros(shape).index_add(0, L.ix, x)
    index = L.ix.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    start = x.new_full(shape, -math.inf if how == "amax" else math.inf)
    return start.scatter_reduce(0, index, x, reduce=how, include_self=True)


def _collapse(L, x, src, dst, how):
    """Reduce the full tensor `x` of shape `src` (padding already neutral) to the shape `dst`."""
    src_level, src_feature = _parse(src)
    dst_level, dst_feature = _parse(dst)
    if src_feature is not None and dst_feature is None:
        x = _reduce_dim(x, -1, how)
    if src_level in ("tok", "pair") and dst_level != src_level:
        x = _reduce_dim(x, 1, how)  # the tokens of a response, the others of a response
        src_level = "resp"
    if src_level == "resp" and dst_level == "group":
        return _segment(L, x, how)
    if src_level != dst_level:  # to the whole batch
        x = _reduce_dim(x, 0, how)
    return x


def _sum(L, x, src, dst):
    """Σ over the elements of `src` that map to each element of `dst`."""
    x = _up(L, x, src, src)
    mask = _exists(L, src)
    if mask is not None:
        x = torch.where(mask, x, 0.0)
    return _collapse(L, x, src, dst, "sum")


def _count(L, src, dst):
    """How many elements of `src` map to each element of `dst`."""
    return _sum(L, 1.0, src, dst)


def _extreme(L, x, src, dst, how, grad):
    x = _up(L, x, src, src)
    mask = _exists(L, src)
    raw = x.detach() if grad else x
    if mask is not None:
        raw = torch.where(mask, raw, -math.inf if how == "amax" else math.inf)
    best = _collapse(L, raw, src, dst, how)
    best = torch.where(_count(L, src, dst) > 0, best, 0.0)
    if not grad:
        return best
    # The gradient goes to every element equal to the result.
    hit = x.detach() == _up(L, best, dst, src)
    if mask is not None:
        hit = hit & mask
    return best + _sum(L, torch.where(hit, x - x.detach(), 0.0), src, dst)


def _max(L, x, src, dst, grad=False):
    return _extreme(L, x, src, dst, "amax", grad)


def _min(L, x, src, dst, grad=False):
    return _extreme(L, x, src, dst, "amin", grad)


def _minimum(a, b):
    return torch.where(a <= b, a, b)


def _maximum(a, b):
    return torch.where(a >= b, a, b)


def _where(L, cond, yes, no):
    return torch.where(_t(L, cond) != 0, _t(L, yes), _t(L, no))


def _sqrt(x):
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, 1.0)), torch.sqrt(x.detach()))


def _pow(L, base, exponent):
    """base ^ exponent when the exponent carries a gradient: y·ln(base) for base > 0, else 0."""
    base, exponent = _t(L, base), _t(L, exponent)
    value = torch.pow(base, exponent.detach())
    log_base = torch.log(torch.where(base > 0, base, 1.0)).detach()
    return value * torch.exp((exponent - exponent.detach()) * log_base)


def _other(L, x):
    """Response j's value at each pair (i, j)."""
    value = x[L.other_ix]
    mask = L.pmask if x.dim() == 1 else L.pmask[..., None]
    return torch.where(mask, value, value.detach())


def _components(L, x):
    """The classes of the transitive closure of the pair condition `x` [B, B] (pair (i, j) joins i
    and j when it is non-zero, so either direction suffices): each response's smallest class member's
    position in its group. Labels start at the positions; each round lowers every label to the
    smallest among the responses joined to it, until nothing changes. No gradient."""
    joined = (_t(L, x).detach() != 0) & L.pmask
    joined = joined | joined.T
    labels = L.resp_index.to(torch.float64)
    while True:
        lowest = torch.where(joined, labels[None, :], math.inf).amin(1)
        lowered = torch.minimum(labels, lowest)
        if torch.equal(lowered, labels):
            return labels.to(L.dtype)
        labels = lowered


def _sum_by_other(L, x):
    """For each response j, Σ over the pairs (i, j)."""
    mask = L.pmask if x.dim() == 2 else L.pmask[..., None]
    return torch.where(mask, x, 0.0).sum(0)


def _unindex(L, x, k, size):
    return torch.where(torch.arange(size, device=L.device) == k, _t(L, x)[..., None], 0.0)


def _compact(L, x):
    """Each row's existing tokens first, in order (a no-op for right-padded rows)."""
    return torch.broadcast_to(_t(L, x), (L.B, L.T)).gather(1, L.order)


def _uncompact(L, x):
    return x.gather(1, L.inv_order)


def _shift(L, x, offset, fill):
    """x at token t + offset of the same response, `fill` past either end."""
    x = _compact(L, x)
    fill = _compact(L, fill).detach()
    position = torch.arange(L.T, device=L.device) + offset
    inside = (position[None, :] >= 0) & (position[None, :] < L.length_long[:, None])
    source = position.clamp(0, max(L.T - 1, 0))[None, :].expand(L.B, L.T)
    return _fill_tok(L, _uncompact(L, torch.where(inside, x.gather(1, source), fill)))


def _scan(L, x, decay, reverse):
    """y_t = x_t + decay·y_{t-1} along each response (from the end when reversed), as a log-depth
    parallel prefix: no loop over tokens. A zero carry contributes 0 whatever the decay."""
    x = _compact(L, x)
    x = torch.where(torch.arange(L.T, device=L.device)[None, :] < L.length_long[:, None], x, 0.0)
    a = _compact(L, decay).detach()
    y, step = x, 1
    while step < L.T:
        if reverse:
            carry = F.pad(y, (0, step))[:, step:]
            a_next = a * F.pad(a, (0, step), value=1.0)[:, step:]
        else:
            carry = F.pad(y, (step, 0))[:, : L.T]
            a_next = a * F.pad(a, (step, 0), value=1.0)[:, : L.T]
        # decay·carry, 0 for a zero carry whatever the decay (rlx's scan: an infinite decay times no
        # carry is 0, not NaN). Only a non-finite decay is replaced, so a finite one keeps its gradient.
        a = torch.where((carry == 0) & ~torch.isfinite(a), torch.zeros_like(a), a)
        y = y + a * carry
        a = a_next
        step *= 2
    return _fill_tok(L, _uncompact(L, y))


def _distinct_ngrams(L, ids, n):
    """Distinct n-grams / n-grams of each response's token values (1 when shorter than n)."""
    ids = _compact(L, ids).detach()
    count = (L.length_long - n + 1).clamp(min=0)
    windows = L.T - n + 1
    if windows <= 0:
        return torch.ones(L.B, dtype=L.dtype, device=L.device)
    grams = ids.unfold(1, n, 1)  # [B, M, n]
    valid = torch.arange(windows, device=L.device)[None, :] < count[:, None]
    # A stable radix sort of each row's n-grams (one pass per position), the valid ones first.
    perm = torch.arange(windows, device=L.device).expand(L.B, windows)
    for position in reversed(range(n)):
        key = grams[..., position].gather(1, perm)
        perm = perm.gather(1, torch.argsort(key, dim=1, stable=True))
    perm = perm.gather(1, torch.argsort((~valid.gather(1, perm)).to(torch.int8), dim=1, stable=True))
    ordered = grams.gather(1, perm[..., None].expand(L.B, windows, n))
    changed = (ordered[:, 1:] != ordered[:, :-1]).any(-1)
    new = torch.cat([torch.ones_like(changed[:, :1]), changed], 1) & valid.gather(1, perm)
    ratio = new.sum(1).to(L.dtype) / count.clamp(min=1).to(L.dtype)
    return torch.where(count > 0, ratio, 1.0)


_U64 = (1 << 64) - 1


def _signed(z):
    """A 64-bit pattern as the int64 that holds it."""
    return z - (1 << 64) if z >= 1 << 63 else z


def _srl(z, s):
    """Logical right shift of int64 tensors holding 64-bit patterns."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z):
    """splitmix64's output function on int64 tensors (multiplications wrap modulo 2^64)."""
    z = (z ^ _srl(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _srl(z, 27)) * _signed(0x94D049BB133111EB)
    return z ^ _srl(z, 31)


def _mix_int(z):
    """splitmix64's output function on a Python int, exactly."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


def _uniform(L, seed, dst):
    """rlx's `uniform(seed over LEVEL)`: for the element at packed position p of the level (groups in
    order, the responses of each group in batch order, tokens in order), with s the seed truncated to a
    64-bit integer (NaN as 0, saturating), h = mix(mix(s + 0x9E3779B97F4A7C15) ^ p) and u = (h >> 11)·2^-53,
    the same bits as rlx's interpreter and kernels (rlx_compiler::ir::uniform). Without `index` in the
    batch, the responses count in row order. No gradient."""
    level, _ = _parse(dst)
    value = float(_t(L, seed).detach())
    if math.isnan(value):
        s = 0
    else:
        s = max(min(math.trunc(value) if math.isfinite(value) else (1 << 63) * (1 if value > 0 else -1),
                    (1 << 63) - 1), -(1 << 63))
    key = _signed(_mix_int((s + 0x9E3779B97F4A7C15) & _U64))
    if level == "batch":
        position = torch.zeros((), dtype=torch.long, device=L.device)
    elif level == "group":
        position = torch.arange(L.G, device=L.device)
    else:
        order = torch.argsort(L.group_ids, stable=True) if L.group_ids is not None else L.arange
        packed = torch.empty_like(order)
        packed[order] = torch.arange(L.B, device=L.device)
        position = packed
        if level == "tok":
            lengths = L.length_long[order]
            starts = torch.cumsum(lengths, 0) - lengths
            position = starts[packed][:, None] + L.token_index.to(torch.long)
    h = _mix(position ^ key)
    return (_srl(h, 11).to(torch.float64) * 2.0**-53).to(L.dtype)


def _rank(L, x, src, dst, within, mask=None, mask_src=None):
    """Each element's 0-based position in descending order among the elements of `dst` ("tok",
    "resp" or "group") that lie in the same element of `within` ("resp", "group" or "batch"); ties
    go to the element earlier in rlx's packed order (groups in order, the responses of each group in
    batch order, tokens in order). NaN sorts above every number. With a mask, the elements where it
    is 0 come after the others. No gradient."""
    level, _ = _parse(dst)
    x = _up(L, x, src, dst).detach()
    excluded = None if mask is None else _up(L, mask, mask_src, dst).detach() == 0
    if level == "tok":
        valid = torch.arange(L.T, device=L.device)[None, :] < L.length_long[:, None]
        values = _compact(L, x)[valid]
        if excluded is not None:
            excluded = _compact(L, excluded)[valid]
        resp = L.arange[:, None].expand(L.B, L.T)[valid]
    elif level == "resp":
        values, resp = x, L.arange
    else:
        values, resp = x, None
    if resp is None:
        group = torch.arange(values.shape[0], device=L.device)
    elif within == "group" or L.group_ids is not None:
        group = L.ix[resp]
    else:
        group = torch.zeros_like(resp)  # no `index`: ties go by row order
    segment = {"batch": torch.zeros_like(group), "group": group, "resp": resp}[within]
    # Row-major order is (response, token); stable sorts by group, then by value (descending),
    # then by set leave each set's elements in rank order.
    perm = torch.sort(group, stable=True).indices
    perm = perm[torch.sort(values[perm], descending=True, stable=True).indices]
    if excluded is not None:
        perm = perm[torch.sort(excluded[perm].to(torch.int8), stable=True).indices]
    perm = perm[torch.sort(segment[perm], stable=True).indices]
    sizes = torch.bincount(segment, minlength=int(segment.max()) + 1 if segment.numel() else 0)
    starts = torch.cumsum(sizes, 0) - sizes
    ranked = torch.arange(values.shape[0], device=L.device) - starts[segment[perm]]
    rank = torch.empty_like(ranked)
    rank[perm] = ranked
    rank = rank.to(L.dtype)
    if level != "tok":
        return rank
    out = torch.zeros((L.B, L.T), dtype=L.dtype, device=L.device)
    out[valid] = rank
    return _uncompact(L, out)


# ---------------------------------------------------------------------------------------------------
# Batches


def _group_ids(index, device):
    if index is None:
        return None
    if torch.is_tensor(index):
        ids = index.reshape(-1).to(device)
    else:
        try:
            ids = torch.as_tensor(index, device=device).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            seen = {}
            ids = torch.tensor(
                [seen.setdefault(key, len(seen)) for key in index], dtype=torch.long, device=device
            )
    return torch.unique(ids, return_inverse=True)[1]


def _params(config, overrides):
    """PARAMS, then `config["rlx"]` (a mapping of param values), then keyword arguments."""
    values = dict(PARAMS)
    given = {}
    if config is not None:
        section = config.get("rlx") if hasattr(config, "get") else getattr(config, "rlx", None)
        if section:
            given.update(section)
    given.update(overrides)
    for name, value in given.items():
        if name not in PARAMS:
            raise ValueError(f"recipe `{RECIPE}` has no param `{name}` (params: {', '.join(PARAMS) or 'none'})")
        values[name] = float(value)
    return values


def _lengths(value, device):
    """`response_length` [B]: each response's token count, whole numbers >= 0."""
    lengths = torch.as_tensor(value, device=device)
    if lengths.dim() == 0:
        lengths = lengths.reshape(1)
    if lengths.dim() != 1 or lengths.dtype == torch.bool or lengths.is_complex():
        raise ValueError(
            f"`response_length` is one whole number of tokens per response, [B]; it is {lengths.dtype} "
            f"of shape {tuple(lengths.shape)}"
        )
    if lengths.is_floating_point():
        bad = ~torch.isfinite(lengths) | (lengths != torch.round(lengths))
        if bool(bad.any()):
            raise ValueError(f"`response_length` must hold whole numbers of tokens; it has {lengths[bad][0].item()}")
    lengths = lengths.to(torch.long)
    if bool((lengths < 0).any()):
        raise ValueError(f"`response_length` must not be negative; it has {int(lengths.min())}")
    return lengths


def _token_mask(batch, needed, tokens, device):
    """The tokens that exist, [B, T] bool: `response_mask`, or `response_length` (right padding), or
    none at all when the recipe reads no token (`tokens` is None). Never guessed from the width of
    the token-level inputs: that would count padding as tokens."""
    mask = batch.get("response_mask")
    lengths = batch.get("response_length")
    if mask is not None:
        mask = torch.as_tensor(mask, device=device)
        if mask.dim() != 2:
            raise ValueError(f"`response_mask` has shape {tuple(mask.shape)}; it is [B, T]")
        mask = mask != 0
        if lengths is not None and not torch.equal(mask.sum(1), _lengths(lengths, device)):
            raise ValueError("`response_mask` and `response_length` disagree on the responses' token counts")
        return mask
    width = None
    for name in needed:
        if _parse(INPUTS[name][0])[0] == "tok" and batch.get(name) is not None:
            width = int(torch.as_tensor(batch[name]).shape[-1])
            break
    if lengths is not None:
        lengths = _lengths(lengths, device)
        longest = int(lengths.max()) if lengths.numel() else 0
        if width is None:
            width = longest
        elif longest > width:
            raise ValueError(
                f"`response_length` says a response has {longest} tokens, but the token-level inputs are {width} wide"
            )
        return torch.arange(width, device=device)[None, :] < lengths[:, None]
    if tokens is not None:
        raise ValueError(
            f"recipe `{RECIPE}` reads {tokens}, so the batch needs `response_mask` [B, T] (the tokens that "
            "exist: verl's `response_mask`, TRL's `completion_mask`) or `response_length` [B] (each "
            "response's token count); without either, padding would count as tokens"
        )
    size = None
    if batch.get("index") is not None:
        size = len(batch["index"])
    for name in needed:
        if size is None and batch.get(name) is not None and _parse(INPUTS[name][0])[0] in ("resp", "group"):
            size = int(torch.as_tensor(batch[name]).shape[0])
    return torch.ones((size or 0, 0), dtype=torch.bool, device=device)


def _layout(batch, needed, tokens):
    """The layout of a padded batch: `response_mask` [B, T] (or `response_length` [B]; required when
    the stage reads tokens: `tokens` says what it reads, None if nothing), `index` [B] (group ids),
    optional `crit_mask` [B, C], `step` and `progress`."""
    tensors = [value for value in batch.values() if torch.is_tensor(value)]
    device = tensors[0].device if tensors else torch.device("cpu")
    # The inputs' floating dtype (at least float32); float64 when they are plain numbers.
    floating = [batch[name].dtype for name in needed if torch.is_tensor(batch.get(name)) and batch[name].is_floating_point()]
    dtype = torch.float32 if floating else torch.float64
    for other in floating:
        dtype = torch.promote_types(dtype, other)
    mask = _token_mask(batch, needed, tokens, device)
    crit_mask = batch.get("crit_mask")
    dim = 0
    for name in needed:
        feature = _parse(INPUTS[name][0])[1]
        value = batch.get(name)
        if value is None:
            continue
        shape = torch.as_tensor(value).shape
        if feature == "crit" and crit_mask is None:
            crit_mask = torch.ones((mask.shape[0], shape[-1]), dtype=torch.bool, device=device)
        if feature == "dim":
            dim = int(shape[-1])
        elif feature is not None and "*" in feature:
            dim = _matrix_dim(feature, shape, _parse(INPUTS[name][0])[0]) or dim
    if crit_mask is not None:
        crit_mask = torch.as_tensor(crit_mask, device=device) != 0
    return _Layout(
        mask,
        _group_ids(batch.get("index"), device),
        crit_mask,
        dim,
        dtype,
        device,
        batch.get("step", 0),
        batch.get("progress", 0),
    )


def _input(L, batch, name):
    """A recipe input from the batch (or its default), laid out for its shape. Group-level inputs
    are given per response, like dataset columns; the value of the group's first response is used."""
    shape, default, _ = INPUTS[name]
    level, feature = _parse(shape)
    value = batch.get(name)
    if value is None and name in STATES:
        return _expand(L, float(getattr(STATE, name)), shape)
    if value is None:
        if default is None:
            raise KeyError(f"recipe `{RECIPE}` needs input `{name}` ({shape}) and the batch has none")
        return _expand(L, default, shape)
    value = torch.as_tensor(value, device=L.device).to(L.dtype)
    expected = L.shape(shape)
    if level == "group":
        expected = (L.B,) + expected[1:]
    if level == "batch" and feature is not None and value.dim() > len(expected) and value.shape[0] == 1:
        # One row of a batch-level vector or matrix (verl's per-sample `compute_score` wraps each value).
        value = value[0]
    if feature is not None and "*" in feature:
        # A matrix is given as [.., R, C] (or already flat, row-major, [.., R*C]) and laid out flat.
        rows, cols = (_axis_width(L, axis) for axis in feature.split("*"))
        if tuple(value.shape) == tuple(expected[:-1]) + (rows, cols):
            value = value.reshape(expected)
    if level == "batch" and feature is None and value.numel() == 1:
        value = value.reshape(())
    if tuple(value.shape) != tuple(expected):
        raise ValueError(
            f"input `{name}` ({shape}) has shape {tuple(value.shape)}; this batch needs {tuple(expected)}"
        )
    if level == "group":
        value = value[L.first_resp]
    if level == "tok":
        value = _fill_tok(L, value)
    if level == "pair":
        # Only (i, j) with j another response of i's group exists (a classifier's verdicts).
        value = torch.where(L.pmask, value, torch.zeros_like(value))
    if feature == "crit":
        value = _fill_crit(L, value, level)
    return value


def _prepare(batch, config, overrides, needed, tokens):
    """The layout and the inputs `needed` (params included, as 0-d tensors); `tokens` says what of
    the tokens the stages read (None: nothing), which makes the token mask required."""
    params = _params(config, overrides)
    L = _layout(batch, needed, tokens)
    x = {name: L.scalar(value) for name, value in params.items()}
    for name in needed:
        x[name] = _input(L, batch, name)
    return L, x


def _missing(batch, names):
    return [name for name in names if batch.get(name) is None and INPUTS[name][1] is None]


def _slice(L, sub, sel, kept_groups, value, shape):
    level = _parse(shape)[0]
    if not torch.is_tensor(value) or level == "batch":
        return value
    if level == "group":
        return value[kept_groups]
    if level == "pair":
        return value[sel][:, sel]
    return value[sel]


_ALL_DROPPED = (
    "every response was filtered out by `keep`: there is nothing to compute advantages and the loss over"
)


def _select(L, x, v, kept, shapes):
    """Phase 2 of a recipe with `keep` filters: the kept responses as a batch of their own, and the
    inputs and phase-1 values restricted to them (they are carried over, not recomputed)."""
    sel = kept.nonzero().squeeze(1)
    if sel.numel() == 0:
        raise ValueError(_ALL_DROPPED)
    sub, kept_groups = L.subset(sel)
    x = {name: _slice(L, sub, sel, kept_groups, value, INPUTS[name][0] if name in INPUTS else "batch")
         for name, value in x.items()}
    v = {name: _slice(L, sub, sel, kept_groups, value, shapes[name]) for name, value in v.items()}
    return sub, x, v, sel


def _kept(L, conditions):
    """Responses whose group and own `keep` conditions hold: conditions are (value, shape, level)."""
    kept = torch.ones(L.B, dtype=torch.bool, device=L.device)
    for value, shape, level in conditions:
        holds = _up(L, value, shape, level) != 0
        kept = kept & (holds[L.ix] if level == "group" else holds)
    return kept


def _per_response(L, value, shape):
    return _up(L, value, shape, "resp")


def _scatter(L, sel, value, size):
    """Per-response values of the kept responses, 0 for the dropped ones."""
    if sel is None:
        return value
    return value.new_zeros(size).index_copy(0, sel, value)


def _advantage_per_response(advantages, response_mask):
    """A per-response advantage from a trainer's [B, T] (or [B]) advantages: the mean over the tokens."""
    advantages = torch.as_tensor(advantages)
    if advantages.dim() == 1:
        return advantages
    mask = torch.as_tensor(response_mask, device=advantages.device).to(advantages.dtype)
    return (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)


# ---------------------------------------------------------------------------------------------------
# Entry points


class Metrics(dict):
    """Metrics of the recipe by name, as floats (a dict: what `loss`, `policy_loss`, `reward_metrics`
    and the reward functions give). `missing` names each metric of the recipe that this call could
    not compute, with the reason: the inputs it needs and the batch lacks (e.g. a reward-side metric
    in a trainer's loss batch, which carries no reward inputs), or that `keep` dropped every
    response. Empty when every metric is there."""

    def __init__(self, values=(), missing=None):
        super().__init__(values)
        self.missing = dict(missing or {})


class State(torch.nn.Module):
    """The recipe's `state` values, carried across training steps (docs/language.md, "State across
    steps"): one float64 buffer per state, so `state_dict()` saves them and `load_state_dict()`
    restores them (e.g. with a trainer's checkpoint). Every entry point reads the state from the
    module's `STATE` unless the batch gives a value by the state's name; the state reads as a
    constant (no gradient flows into it).

    Like a batch norm's running statistics, the state is updated in forward, under no_grad, when
    the module is in training mode (the default; `STATE.eval()` freezes it): `loss` and
    `policy_loss` call `STATE(metrics)` after each step with the step's metrics, which include each
    update as the metric `state.NAME`. `compute_rewards`, `evaluate` and the reward side never
    update it. A state whose update a call cannot compute (its inputs are not in the batch) is an
    error in training mode, never a silently stale value."""

    def __init__(self):
        super().__init__()
        for name, (_, _, init) in STATES.items():
            self.register_buffer(name, torch.tensor(init, dtype=torch.float64))

    def forward(self, metrics):
        """Store the updates in `metrics` (a dict with the metrics `state.NAME`) when training."""
        if not self.training:
            return self
        missing = getattr(metrics, "missing", {})
        with torch.no_grad():
            for name, (metric, elem, _) in STATES.items():
                if metric not in metrics:
                    why = missing.get(metric, f"the metrics lack `{metric}`")
                    raise ValueError(f"cannot update state `{name}` of recipe `{RECIPE}`: {why}")
                value = float(metrics[metric])
                if elem == "bool":
                    value = float(value != 0.0)
                getattr(self, name).fill_(value)
        return self


STATE = State()


def _needs_text(names):
    return ", ".join("the group structure (`index`)" if n == "index" else f"`{n}`" for n in names)


def _metric_why(name, lacking, lacks):
    where = ""
    if name in REWARD_SIDE_METRICS:
        where = " (a reward-side metric: make_reward_func's reward functions and reward_metrics compute it)"
    return f"metric `{name}` needs {_needs_text(lacking)}, which {lacks}{where}"


def compute_rewards(batch, config=None, **params):
    """Reward, advantage (0 for responses dropped by `keep`), `kept` and every metric of the recipe,
    detached, from a padded batch: each recipe input by name ([B, T] for token-level inputs, [B] per
    response, group-level inputs per response too), `response_mask` [B, T], `index` [B] (the group
    of each response: ints, or any hashable ids such as verl's `uid` strings)."""
    with torch.no_grad():
        out = evaluate(batch, config, **params)
    return {name: value.detach() for name, value in out.items()}


def loss(batch, config=None, **params):
    """The recipe's loss on a padded batch (see `compute_rewards`), as `(loss, metrics)`; the gradient
    comes from autograd. `metrics` is a `Metrics` dict of floats: on the whole batch, every metric of
    the recipe (METRICS), with the rlx runtime's values.

    With `advantages` in the batch ([B] or [B, T]) the recipe's advantage is replaced by it (a
    trainer's advantages, e.g. TRL's) and `keep` filters are not applied: the trainer has chosen the
    responses. Then `metrics` has every metric whose inputs the batch has; `metrics.missing` names
    the others and what they need. A trainer's loss inputs carry no reward inputs: the reward-side
    metrics (REWARD_SIDE_METRICS) come from the reward functions (`make_reward_func`) or from
    `reward_metrics`, or pass their inputs (and `index`) in the batch."""
    if batch.get("advantages") is not None:
        value, metrics = _loss_given(batch, config, params, batch["advantages"], "the batch lacks")
        STATE(metrics)
        return value, metrics
    out = evaluate(batch, config, **params)
    if "loss" not in out:
        raise ValueError(f"recipe `{RECIPE}` has no loss section")
    metrics = Metrics({name: float(out[name].detach()) for name in METRICS})
    STATE(metrics)
    return out["loss"], metrics


def _loss_given(batch, config, params, advantages, lacks):
    if _LOSS_GIVEN_ADVANTAGE is None:
        raise NotImplementedError(_LOSS_GIVEN_ADVANTAGE_WHY)
    run, needed, metric_runs = _LOSS_GIVEN_ADVANTAGE
    available = {name for name in INPUTS if batch.get(name) is not None or INPUTS[name][1] is not None}
    if batch.get("index") is not None:
        available.add("index")
    missing = [name for name in needed if name not in available]
    if missing:
        raise KeyError(
            f"the loss of recipe `{RECIPE}` needs {', '.join(f'`{n}`' for n in missing)}, which the batch lacks"
        )
    runs, why = {}, {}
    for name, (metric_run, metric_needs) in metric_runs.items():
        lacking = [n for n in metric_needs if n not in available]
        if lacking:
            why[name] = _metric_why(name, lacking, lacks)
        else:
            runs[name] = metric_run
    wanted = set(needed)
    for name, (_, metric_needs) in metric_runs.items():
        if name in runs:
            wanted.update(metric_needs)
    L, x = _prepare(batch, config, params, [name for name in INPUTS if name in wanted], _LOSS_GIVEN_ADVANTAGE_TOKENS)
    v = {"advantage": _advantage_per_response(advantages, L.tmask).to(device=L.device, dtype=L.dtype)}
    value = _t(L, run(L, x, v))
    metrics = Metrics(missing=why)
    with torch.no_grad():
        for name, metric_run in runs.items():
            metrics[name] = float(metric_run(L, x, dict(v)))
    return value, metrics


def trl_batch(inputs, per_token_logps, **extra):
    """A batch for `loss` from the `inputs` of TRL's `GRPOTrainer._compute_loss` and the per-token
    log-probabilities it computed, by rlx's naming convention (`logp`, `old_logp`, `ref_logp`,
    `sampler_logp`, `mask`); `extra` adds or overrides recipe inputs."""
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    old = inputs.get("old_per_token_logps")
    batch = {
        "response_mask": mask,
        POLICY_INPUT: per_token_logps,
        "old_logp": per_token_logps.detach() if old is None else old,
        "ref_logp": inputs.get("ref_per_token_logps"),
        "sampler_logp": inputs.get("sampling_per_token_logps"),
        "advantages": inputs.get("advantages"),
    }
    batch.update(extra)
    return {key: value for key, value in batch.items() if value is not None}


def _agg_scale(response_mask, loss_agg_mode, config):
    """verl sums the losses of micro-batches and data-parallel ranks (`agg_loss` with
    `global_batch_info`); the recipe's loss is a mean over the micro-batch, so rescale it as verl's
    `loss_agg_mode` would: by the micro-batch's share of the global tokens (or sequences) × dp."""
    info = None
    if config is not None:
        info = config.get("global_batch_info") if hasattr(config, "get") else getattr(config, "global_batch_info", None)
    info = info or {}
    dp = info.get("dp_size") or 1
    mask = torch.as_tensor(response_mask) != 0
    if loss_agg_mode == "token-mean":  # (counts in float64: exact)
        total = info.get("batch_num_tokens")
        return 1.0 if total is None else mask.sum().double() / total * dp
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        total = info.get("global_batch_size")
        return 1.0 if total is None else mask.any(-1).sum().double() / total * dp
    if loss_agg_mode == "token-sum":
        return float(dp)
    raise ValueError(f"unknown loss_agg_mode `{loss_agg_mode}`")


def policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="token-mean",
    config=None,
    rollout_is_weights=None,
):
    """verl's `PolicyLossFn`: the recipe's loss for a micro-batch, with verl's advantages ([B, T],
    averaged over each response's tokens) in place of the recipe's, as `(loss, metrics)`. The loss
    is rescaled for verl's micro-batch and data-parallel sums according to `loss_agg_mode` (set it
    to the recipe's aggregation); params come from PARAMS (regenerate with `rlxc compile --set`).

    `metrics` is what verl's own policy losses return: `{"actor/NAME": float}`, for every metric of
    the recipe that verl's arguments determine (POLICY_LOSS_METRICS); verl's actor logs them as they
    are. `metrics.missing` names the others (by metric name) and what they need that verl does not
    pass (POLICY_LOSS_METRICS_WHY)."""
    if POLICY_LOSS_WHY is not None:
        raise NotImplementedError(POLICY_LOSS_WHY)
    batch = {"response_mask": response_mask, POLICY_INPUT: log_prob}
    if "old_logp" in INPUTS:
        batch["old_logp"] = old_log_prob
    if rollout_is_weights is not None:
        if "rollout_is_weights" not in INPUTS:
            raise ValueError(
                f"verl passed rollout_is_weights, but recipe `{RECIPE}` does not read them: declare "
                "`input rollout_is_weights : f32[tok]` in the recipe or turn verl's "
                "algorithm.rollout_correction off (the recipe's own correction, if any, applies)"
            )
        batch["rollout_is_weights"] = rollout_is_weights
    value, metrics = _loss_given(batch, None, {}, advantages, _VERL_LACKS)
    STATE(metrics)
    scale = _agg_scale(response_mask, loss_agg_mode, config)
    return value * scale, Metrics({f"actor/{name}": metric for name, metric in metrics.items()}, metrics.missing)


_VERL_LACKS = "verl's PolicyLossFn does not receive (it gets log_prob, old_log_prob, advantages, response_mask, rollout_is_weights)"


def _policy_loss_metrics():
    """The metrics `policy_loss` returns, and why not the others (by name)."""
    if POLICY_LOSS_WHY is not None:
        return (), {name: POLICY_LOSS_WHY for name in METRICS}
    given = {name for name in INPUTS if INPUTS[name][1] is not None}
    given.update(name for name in (POLICY_INPUT, "old_logp", "rollout_is_weights") if name in INPUTS)
    returned, why = [], {}
    for name, (_, needs) in _LOSS_GIVEN_ADVANTAGE[2].items():
        lacking = [n for n in needs if n not in given]
        if lacking:
            why[name] = _metric_why(name, lacking, _VERL_LACKS)
        else:
            returned.append(name)
    return tuple(returned), why


# The metrics policy_loss returns (as actor/NAME), and for each other metric why verl cannot have it.
POLICY_LOSS_METRICS, POLICY_LOSS_METRICS_WHY = _policy_loss_metrics()


def advantage_estimator(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """verl's advantage-estimator interface: the recipe's advantage (and `keep` filters: dropped
    responses get 0) from verl's rewards, summed over tokens as the recipe's reward, and `index`
    (verl's `uid`). Returns (advantages, returns), both the advantage broadcast over the tokens."""
    if _ADVANTAGE_GIVEN_REWARD is None:
        raise NotImplementedError(_ADVANTAGE_GIVEN_REWARD_WHY)
    keep_run, advantage_run, shapes = _ADVANTAGE_GIVEN_REWARD
    mask = torch.as_tensor(response_mask)
    batch = {"response_mask": mask, "index": index}
    L, x = _prepare(batch, None, {}, [name for name in INPUTS if INPUTS[name][1] is not None], None)
    v = {"reward": token_level_rewards.sum(-1).to(L.dtype)}
    sel = None
    size = L.B
    if keep_run is not None:
        kept = _kept(L, keep_run(L, x, v))
        L, x, v, sel = _select(L, x, v, kept, shapes)
    advantage = _scatter(L, sel, _per_response(L, advantage_run(L, x, v), ADVANTAGE_SHAPE), size)
    advantage = advantage[:, None].to(token_level_rewards.dtype) * mask.to(token_level_rewards.dtype)
    return advantage, advantage


def make_compute_score(inputs_fn=None):
    """A verl `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`
    returning the recipe's reward of one response. The reward's inputs are read from `inputs_fn(
    data_source, solution_str, ground_truth, extra_info)` (a dict, e.g. a verifier's or a judge's
    verdicts), then keyword arguments, then `extra_info` (dataset fields such as a prompt's rubric
    points). Only for recipes whose reward is per response.

    verl's reward managers pass no token count (`solution_str` is decoded text), so a reward that
    reads tokens (`length`, a token-level input: REWARD_TOKENS) needs `response_length`, the
    response's token count as sampled, from one of those sources; without it compute_score raises,
    rather than scoring a response of no tokens."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        if not REWARD_PER_RESPONSE:
            raise NotImplementedError(
                f"the reward of recipe `{RECIPE}` depends on the other responses of the group "
                f"({REWARD_GROUP_WHY}); verl scores one response at a time: use `reward_func` "
                "(TRL) or `compute_rewards` on whole groups"
            )
        values = {}
        sources = [dict(extra_info or {}), kwargs]
        if inputs_fn is not None:
            sources.append(dict(inputs_fn(data_source, solution_str, ground_truth, extra_info) or {}))
        for source in sources:
            values.update({k: v for k, v in source.items() if k in INPUTS or k == "response_length"})
        length = values.pop("response_length", None)
        if length is None and REWARD_TOKENS is not None:
            raise ValueError(
                f"the reward of recipe `{RECIPE}` reads {REWARD_TOKENS}, so compute_score needs "
                "`response_length`, the response's token count as sampled, which verl's reward managers "
                "do not pass: return it from inputs_fn (e.g. the length of the response's token ids), "
                "or put it in extra_info or a keyword argument"
            )
        batch = {name: [value] for name, value in values.items()}
        if length is not None:
            batch["response_length"] = [length]
        batch["index"] = [0]
        return float(_reward_only(batch)[0])

    return compute_score


compute_score = make_compute_score()


def _reward_only(batch, config=None, **params):
    if _reward is None:
        raise NotImplementedError(f"recipe `{RECIPE}` has no reward section")
    missing = _missing(batch, REWARD_INPUTS)
    if missing:
        raise KeyError(
            f"the reward of recipe `{RECIPE}` needs {', '.join(f'`{n}`' for n in missing)}, which were not given"
        )
    L, x = _prepare(batch, config, params, REWARD_INPUTS, REWARD_TOKENS)
    with torch.no_grad():
        return _per_response(L, _reward(L, x, {}), REWARD_SHAPE)


def _reward_side(batch, config=None, params=None, metrics=True):
    """The reward, keep and advantage stages and the reward-side metrics (REWARD_SIDE_METRICS) on a
    padded batch, detached, as rlx computes them: the reward and `keep` on the whole batch, the
    advantage and the metrics on the kept responses. A dict: `reward` and `advantage` [B] (0 for the
    dropped responses; None where the recipe has no such section), `kept` [B] and `metrics` (a
    `Metrics`; empty, each metric in `missing`, when `keep` drops every response, as rlx logs no
    recipe metric for a step it skips). With metrics=False they are not computed (nor do tokens
    have to be given for them)."""
    reward_run, keep_run, advantage_run, metric_runs, shapes = _REWARD_SIDE
    missing = _missing(batch, _REWARD_SIDE_INPUTS)
    if missing:
        raise KeyError(
            f"the reward side of recipe `{RECIPE}` (reward, keep, advantage) needs "
            f"{', '.join(f'`{n}`' for n in missing)}, which were not given"
        )
    tokens = _REWARD_SIDE_TOKENS if metrics else _ADVANTAGE_TOKENS
    with torch.no_grad():
        L, x = _prepare(batch, config, params or {}, _REWARD_SIDE_INPUTS, tokens)
        v = {}
        size, sel = L.B, None
        out = {"reward": None, "advantage": None, "kept": torch.ones(L.B, dtype=torch.bool, device=L.device)}
        out["metrics"] = Metrics()
        if reward_run is not None:
            out["reward"] = _per_response(L, reward_run(L, x, v), REWARD_SHAPE)
        if keep_run is not None:
            out["kept"] = kept = _kept(L, keep_run(L, x, v))
            if not bool(kept.any()):
                out["metrics"].missing.update(
                    {name: f"`keep` dropped every response: no metric `{name}`" for name in REWARD_SIDE_METRICS}
                )
                return out
            L, x, v, sel = _select(L, x, v, kept, shapes)
        if advantage_run is not None:
            out["advantage"] = _scatter(L, sel, _per_response(L, advantage_run(L, x, v), ADVANTAGE_SHAPE), size)
        if metrics:
            for name, metric_run in metric_runs.items():
                out["metrics"][name] = float(metric_run(L, x, v))
    return out


def reward_metrics(batch, config=None, **params):
    """The reward-side metrics (REWARD_SIDE_METRICS: those that read only what the reward, keep and
    advantage stages read) on a padded batch (see `compute_rewards`), as a `Metrics` dict of floats
    with the rlx runtime's values: computed after `keep`, on the responses it keeps (none, each in
    `missing`, when it drops every response). For a trainer whose loss never sees the reward inputs
    (verl's PolicyLossFn, TRL's loss inputs): call it where the rewards are computed."""
    return _reward_side(batch, config, params)["metrics"]


def _trl_batch_of(inputs_fn, prompts, completions, completion_ids, kwargs, tokens):
    """A padded batch from a TRL reward function's arguments (see `make_reward_func`)."""
    if completion_ids is None and tokens is not None:
        raise ValueError(
            f"recipe `{RECIPE}` reads {tokens}, so its reward function needs `completion_ids` (TRL "
            "passes them: each completion's token ids), which give the completions' token counts"
        )
    columns = {k: v for k, v in kwargs.items() if k in INPUTS}
    if inputs_fn is not None:
        columns.update(
            inputs_fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs) or {}
        )
    size = len(completions)
    counts = None if completion_ids is None else [len(ids) for ids in completion_ids]
    if counts is not None and len(counts) != size:
        raise ValueError(f"{len(counts)} completion_ids for {size} completions")
    longest = max(counts, default=0) if counts is not None else 0
    batch = {"index": [repr(prompt) for prompt in prompts]}
    for name, column in columns.items():
        level, feature = _parse(INPUTS[name][0])
        if level == "batch":
            batch[name] = column[0] if isinstance(column, (list, tuple)) else column
        elif level == "tok":  # ragged: one row per completion, as long as its completion_ids
            if counts is None:
                raise ValueError(f"the token-level input `{name}` needs `completion_ids` for the completions' token counts")
            rows = [list(row) for row in column]
            if len(rows) != size:
                raise ValueError(f"the token-level input `{name}` has {len(rows)} rows for {size} completions")
            for row, (values, count) in enumerate(zip(rows, counts)):
                if len(values) != count:
                    raise ValueError(
                        f"the token-level input `{name}` has {len(values)} values for completion {row}, "
                        f"whose completion_ids have {count} tokens"
                    )
            batch[name] = [values + [0.0] * (longest - len(values)) for values in rows]
        elif level == "pair":  # per completion: its value with each other completion of its prompt
            rows = [list(row) for row in column]
            if len(rows) != size:
                raise ValueError(f"the pair input `{name}` has {len(rows)} rows for {size} completions")
            keys = batch["index"]
            matrix = [[0.0] * size for _ in range(size)]
            for i, values in enumerate(rows):
                others = [j for j in range(size) if j != i and keys[j] == keys[i]]
                if len(values) != len(others):
                    raise ValueError(
                        f"the pair input `{name}` has {len(values)} values for completion {i}, whose prompt has "
                        f"{len(others)} other completions (one value per other completion, in order)"
                    )
                for j, value in zip(others, values):
                    matrix[i][j] = float(value)
            batch[name] = matrix
        elif feature == "crit":  # ragged: pad, and say which criteria each prompt has
            rows = [list(row) for row in column]
            width = max((len(row) for row in rows), default=0)
            batch[name] = [row + [0.0] * (width - len(row)) for row in rows]
            batch["crit_mask"] = [[True] * len(row) + [False] * (width - len(row)) for row in rows]
        else:
            batch[name] = column
    if completion_ids is not None:
        batch["response_length"] = counts
        if "ids" in INPUTS and "ids" not in batch:
            ids = torch.zeros((size, longest), dtype=torch.float64)
            for row, tokens_of in enumerate(completion_ids):
                ids[row, : len(tokens_of)] = torch.as_tensor(list(tokens_of), dtype=torch.float64)
            batch["ids"] = ids
    return batch


def _call_key(prompts, completions, completion_ids):
    """What identifies one scoring call of TRL (the companion reward function reuses its rewards)."""
    ids = None if completion_ids is None else tuple(tuple(int(token) for token in row) for row in completion_ids)
    return tuple(repr(p) for p in prompts), tuple(repr(c) for c in completions), ids


def _side_metrics(batch, have_lengths):
    """The reward-side metrics of a reward function's batch, or why not (in `missing`)."""
    if not REWARD_SIDE_METRICS:
        return Metrics()
    lacking = _missing(batch, _REWARD_SIDE_INPUTS)
    if not lacking and _REWARD_SIDE_TOKENS is not None and not have_lengths:
        lacking = ["completion_ids"]
    if lacking:
        return Metrics(missing={name: _metric_why(name, lacking, "the reward function was not given") for name in REWARD_SIDE_METRICS})
    return _reward_side(batch)["metrics"]


def make_reward_func(inputs_fn=None, output="reward"):
    """A TRL reward function `f(prompts, completions, completion_ids=None, **kwargs) -> list[float]`
    computing the recipe's reward. Completions with the same prompt form a group (so group terms
    such as diversity see the whole group when TRL scores it together). The reward's inputs come from
    `inputs_fn(prompts=…, completions=…, completion_ids=…, **kwargs)` (a dict of per-completion
    lists; a token-level input as one list per completion, as long as its `completion_ids`), then
    the dataset columns TRL passes as keyword arguments; token counts from `completion_ids` (TRL
    passes each completion's ids, unpadded), and a token-level input named `ids` from the token ids.
    A recipe that reads tokens (`length`, a token-level input) without `completion_ids` is an error.

    With output="advantage" it returns the recipe's advantage instead (0 for responses its `keep`
    filters drop): with GRPOConfig(scale_rewards="none"), TRL's centring leaves a zero-mean advantage
    unchanged, so TRL trains on the recipe's own advantages. TRL logs a reward function's values as
    `rewards/<name>/mean` (here the advantage, under `NAME_advantage`); to keep the reward logged, add
    the function's `reward_func` (named NAME, as `reward_func` is) with weight 0:
    `reward_funcs=[f, f.reward_func], reward_weights=[1.0, 0.0]`. It returns the reward of the
    completions `f` has just scored without calling `inputs_fn` again.

    Both compute the reward-side metrics (REWARD_SIDE_METRICS) on the batch they score, as rlx does
    (after `keep`), keep the last ones in `f.metrics` (a `Metrics`) and, when TRL passes `log_metric`
    (TRL >= 1.0), log each as `rlx/NAME`."""
    if output not in ("reward", "advantage"):
        raise ValueError("output is 'reward' or 'advantage'")
    last = {}

    def reward_func(prompts, completions, completion_ids=None, **kwargs):
        tokens = REWARD_TOKENS if output == "reward" else _ADVANTAGE_TOKENS
        batch = _trl_batch_of(inputs_fn, prompts, completions, completion_ids, kwargs, tokens)
        last.clear()
        if output == "reward":
            values = _reward_only(batch)
            metrics = _side_metrics(batch, completion_ids is not None)
        else:
            if _advantage is None:
                raise NotImplementedError(f"recipe `{RECIPE}` has no advantage section")
            with_metrics = completion_ids is not None or _REWARD_SIDE_TOKENS is None
            side = _reward_side(batch, metrics=with_metrics)
            if not bool(side["kept"].any()):
                raise ValueError(_ALL_DROPPED)
            values = side["advantage"]
            metrics = side["metrics"] if with_metrics else _side_metrics(batch, False)
            if side["reward"] is not None:
                last["key"] = _call_key(prompts, completions, completion_ids)
                last["reward"] = [float(r) for r in side["reward"]]
        reward_func.metrics = metrics
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for name, value in metrics.items():
                log_metric(f"rlx/{name}", value)
        return [float(r) for r in values]

    reward_func.__name__ = NAME if output == "reward" else f"{NAME}_advantage"
    reward_func.metrics = Metrics()
    if output == "advantage":
        if _reward is None:
            reward_func.reward_func = None
        else:

            def companion(prompts, completions, completion_ids=None, **kwargs):
                """The recipe's reward of the completions (those the advantage function has just
                scored: its rewards, without calling inputs_fn again), for TRL to log."""
                if last.get("key") == _call_key(prompts, completions, completion_ids):
                    return list(last["reward"])
                batch = _trl_batch_of(inputs_fn, prompts, completions, completion_ids, kwargs, REWARD_TOKENS)
                return [float(r) for r in _reward_only(batch)]

            companion.__name__ = NAME
            reward_func.reward_func = companion
    return reward_func


reward_func = make_reward_func()


def _register_with_verl():
    """Register `policy_loss` (and `advantage_estimator`) under NAME when verl is importable."""
    import importlib.util

    try:
        if importlib.util.find_spec("verl") is None:
            return False
        from verl.trainer.ppo import core_algos
    except Exception:  # verl present but not importable here: nothing to register
        return False
    policy_loss.rlx_source = advantage_estimator.rlx_source = (SOURCE, SOURCE_SHA256)
    entries = (
        ("POLICY_LOSS_REGISTRY", policy_loss, core_algos.register_policy_loss, POLICY_LOSS_WHY is None),
        ("ADV_ESTIMATOR_REGISTRY", advantage_estimator, core_algos.register_adv_est, _ADVANTAGE_GIVEN_REWARD is not None),
    )
    for registry_name, function, register, wanted in entries:
        registry = getattr(core_algos, registry_name, {})
        if not wanted:
            continue
        previous = getattr(registry.get(NAME), "rlx_source", None)
        if previous is not None:  # an rlx module by this name was imported before: the last one wins
            if previous != function.rlx_source:
                import warnings

                warnings.warn(f"{NAME}: replacing the verl registration of {previous[0]} by {SOURCE}")
            registry[NAME] = function
        else:
            register(NAME)(function)
    return True
