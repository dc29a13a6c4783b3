"""Import graph of each workspace crate at the granularity of its top-level modules.

A *unit* is a top-level file `src/foo.rs` or folder `src/foo/` (`lib.rs`/`main.rs` are roots
that re-export; `src/bin/` holds separate programs). A -> B when code in A names a path into
B: `use crate::b::…` (grouped trees too), inline `crate::b::f()` or `$crate::b`, `super::`
paths that climb out of A, a name the root re-exports (`crate::Tensor` -> `tensor`), and
`<libname>::b` in a crate with both `lib.rs` and `main.rs`. Comments, literals and
`#[cfg(test)]` items (and the files of `#[cfg(test)] mod x;`) give no edges; edges only
test code makes are listed apart. Method calls (`t.redistribute()`) are not imports.
Inside each folder the same is done one level down (`foo::bar`; `foo::(mod)` for
`foo/mod.rs` or `foo.rs`) to find circles among its files.

Per crate: units, lines (every `.rs` under `src/`), the biggest unit's share, edges,
circles (strongly connected components of more than one unit) and, where LAYERS has an
order (lower first), the imports back up: edges from a lower unit to a higher one (units
not in the order count as top; units of the order not in the tree are skipped).

Usage: python3 xtask/python/import_graph.py [--crate NAME] [--json] [--root DIR]
         [--order a,b,c (for the one --crate)] [--drop a,b (leave out their edges)]
"""
import argparse, json, re, sys
from pathlib import Path

# Layer orders, lower first; None: unknown. redco-core follows docs/ARCHITECTURE.md
# sections 2-3: the vocabulary, `backend`, `tensor`/`autograd`/`display`, then `runtime`
# ("imports none of the other three") and `sharding` below the ops that use them
# (`ops -> sharding` is the forward arrow of cycle 4, `ops -> runtime` the one explained
# file), `cpu` over `ops` and `runtime`, `nn`, `optim` over both, and `planning` under
# `pipeline` ("only pipeline imports planning"). The doc's cycles (backend -> ops,
# tensor -> autograd, ops -> nn, dtype -> cpu, the vocabulary's) then count as back up.
# `host_simd` (out of `cpu/` in the crate split: the SIMD detection `dtype` uses) is lowest;
# `recompute` (the tape, out of `ops/`) sits on autograd.
LAYERS = {
    "redco-core": ["host_simd", "dtype", "shape", "error", "placement", "backend", "tensor",
                   "autograd", "recompute", "display", "runtime", "sharding", "ops", "cpu", "nn", "optim",
                   "planning", "pipeline"],
    # kv cache, grammar, the engine over both, rank 0's broadcast, the loop, the HTTP front
    "redco-serve": ["kv", "guide", "engine", "lockstep", "worker", "http"],
    # files (hf/, gguf/), parameters, `CausalLm` and the samplers every model implements
    # and runs (generate/), the layer loop, one file per architecture, what picks among them
    "redco-models": ["hf", "gguf", "params", "build", "generate", "stack", "llama", "gptj",
                     "opt", "t5", "seq2seq", "tiny", "presets", "auto"],
    "redco": ["plot", "observe", "cmd"],
    # MPI calls, the watchdog, the Collective, then `Mpi` (the CommFactory that makes them)
    "redco-mpi": ["wire", "watchdog", "collective", "env", "launch", "check"],
    "redco-cpu": None, "redco-train": None, "redco-pipeline": None,  # unknown order
}
KNOWN = ["redco-core", "redco-cpu", "redco-models", "redco-serve", "redco", "redco-cuda",
         "redco-wgpu", "redco-tpu", "redco-mpi", "redco-train", "redco-pipeline"]

TOKEN = re.compile(r"""(?P<line>//[^\n]*)|(?P<block>/\*)|(?P<raw>(?<!\w)[bc]?r(?P<h>\#*)".*?"(?P=h))
    |(?P<str>"(?:\\.|[^"\\])*")|(?P<chr>'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])')
    |(?P<life>'\w+)""", re.S | re.X)
TEST_ATTR = re.compile(r"#\[cfg\((?:test|all\(\s*test\b[^\]]*)\)\]")
USE = re.compile(r"(\bpub\b(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);")
PUB_IN = re.compile(r"pub\s*\(\s*in\s+[^)]*\)")
INLINE = re.compile(r"(?<![\w:$])(\$crate|crate|super|self|[a-z_]\w*)((?:\s*::\s*\w+)+)")
MOD_BLOCK = re.compile(r"\bmod\s+(\w+)\s*\{")


def blank(s):
    return re.sub(r"[^\n]", " ", s)


def strip_code(text):
    """Comments and literal contents replaced by spaces; lines and offsets kept."""
    out, pos = [], 0
    while (m := TOKEN.search(text, pos)):
        out.append(text[pos:m.start()])
        end = m.end()
        if m.group("block"):
            depth, end = 1, m.end()
            while depth and end < len(text):
                if text.startswith("/*", end): depth, end = depth + 1, end + 2
                elif text.startswith("*/", end): depth, end = depth - 1, end + 2
                else: end += 1
        out.append(m.group(0) if m.group("life") else blank(text[m.start():end]))
        pos = end
    return "".join(out) + text[pos:]


def match_brace(code, i, pair="{}"):
    """Index just past the bracket closing the one opened at i."""
    depth = 0
    for j in range(i, len(code)):
        depth += {pair[0]: 1, pair[1]: -1}.get(code[j], 0)
        if depth == 0: return j + 1
    return len(code)


def test_items(code):
    """Spans of `#[cfg(test)]` items and the names of `#[cfg(test)] mod x;` children."""
    spans, mods = [], set()
    for m in TEST_ATTR.finditer(code):
        i = m.end()
        while (a := re.compile(r"\s*#\[").match(code, i)):  # further attributes on the item
            i = match_brace(code, a.end() - 1, "[]")
        start, depth = i, 0
        while i < len(code):
            c = code[i]
            if c in "([": depth += 1
            elif c in ")]": depth -= 1
            elif c == ";" and depth == 0: i += 1; break
            elif c == "{" and depth == 0 and not re.match(r"[^;]*\buse\b", code[start:i]):
                i = match_brace(code, i); break
            i += 1
        if (d := re.match(r"(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code[start:i].strip())):
            mods.add(d.group(1))
        spans.append((m.start(), i))
    return spans, mods


def expand_use(body):
    """`a::{b, c::{self, d as e}, *}` -> [(path, alias), …]."""
    toks = re.findall(r"\$?\w+|::|[{},*]", body)

    def tree(i, prefix):
        path = list(prefix)
        while i < len(toks):
            t = toks[i]
            if t == "::" and not path: i += 1; continue
            if t == "{":
                out, i = [], i + 1
                while i < len(toks) and toks[i] != "}":
                    sub, i = tree(i, path)
                    out += sub
                    if i < len(toks) and toks[i] == ",": i += 1
                return out, i + 1
            if t == "*": return [(path + ["*"], None)], i + 1
            if not (t == "self" and path): path.append(t)
            i += 1
            if i < len(toks) and toks[i] == "::": i += 1; continue
            alias = toks[i + 1] if i + 1 < len(toks) and toks[i] == "as" else None
            return [(path, alias)], i + (2 if alias else 0)
        return [(path, None)], i
    return tree(0, [])[0]


def module_path(rel):
    parts = list(rel.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "mod" or parts in (["lib"], ["main"]) else parts


class Crate:
    def __init__(self, name, src, libname):
        self.name, self.src = name, src
        self.files, self.lines = {}, {}  # rel path -> (module path, stripped code); line count
        for f in sorted(src.rglob("*.rs")):
            if (rel := f.relative_to(src)).parts[0] != "bin":
                text = f.read_text(errors="replace")
                self.files[rel], self.lines[rel] = (module_path(rel), strip_code(text)), text.count("\n")
        self.modules = {tuple(mp) for mp, _ in self.files.values()}
        self.units = sorted({mp[0] for mp, _ in self.files.values() if mp})
        self.kids = {u: {m[1] for m in self.modules if len(m) > 1 and m[0] == u} for u in self.units}
        self.has_root = {u: (u,) in self.modules for u in self.units}
        both = (src / "lib.rs").exists() and (src / "main.rs").exists()
        self.prefixes = {"crate", "$crate"} | ({libname} if both else set())
        self.reexports, self.test_mods, self.parsed = {}, set(), {}
        for rel, (mp, code) in self.files.items():
            spans, mods = test_items(code)
            self.test_mods |= {tuple(mp) + (m,) for m in mods}
            self.parsed[rel] = spans
            for m in USE.finditer(code):
                if m.group(1):
                    for path, alias in expand_use(m.group(2)):
                        if path[-1] != "*" and (t := self.resolve(path, mp)):
                            self.reexports.setdefault(tuple(mp), {})[alias or path[-1]] = t

    def resolve(self, segs, mp):
        """Absolute module path (no `crate`) named by segs written in module mp, or None."""
        head, rest = segs[0], segs[1:]
        if head in self.prefixes: return rest
        if head == "self": return mp + rest
        if head == "super":
            base = list(mp)
            while segs and segs[0] == "super":
                if not base: return None
                base.pop(); segs = segs[1:]
            return base + segs
        return mp + segs if tuple(mp) + (head,) in self.modules else None

    def target(self, abs_, sub_of=None):
        if not abs_: return None
        if abs_[0] not in self.units:
            t = self.reexports.get((), {}).get(abs_[0])
            if not t or t[0] not in self.units: return None
            abs_ = t + abs_[1:]
        u = abs_[0]
        if sub_of is None: return u
        if u != sub_of: return None
        if len(abs_) > 1:
            s = abs_[1]
            t = self.reexports.get((u,), {}).get(s)
            if s not in self.kids[u] and t and len(t) > 1 and t[0] == u: s = t[1]
            if s in self.kids[u]: return f"{u}::{s}"
        return f"{u}::(mod)" if self.has_root[u] else None

    def paths(self, code, mp):
        """(offset, path segments, module path where written) for every path in code."""
        regions = [(m.start(), match_brace(code, m.end() - 1), m.group(1)) for m in MOD_BLOCK.finditer(code)]
        def where(pos):
            return mp + [n for s, e, n in regions if s < pos < e]
        code = PUB_IN.sub(lambda m: blank(m.group(0)), code)
        for m in USE.finditer(code):
            for path, _ in expand_use(m.group(2)):
                if path: yield m.start(), path, where(m.start())
        code = USE.sub(lambda m: blank(m.group(0)), code)
        for m in INLINE.finditer(code):
            yield m.start(), [m.group(1)] + re.findall(r"\w+", m.group(2)), where(m.start())

    def graph(self):
        """{(a, b): {"lib"|"test": [file:line, …]}} for units and for sub-units of folders."""
        edges, sub = {}, {}
        for rel, (mp, code) in self.files.items():
            if not mp: continue
            u = mp[0]
            src_sub = f"{u}::{mp[1]}" if len(mp) > 1 else f"{u}::(mod)"
            whole_test = any(tuple(mp[:k]) in self.test_mods for k in range(1, len(mp) + 1))
            spans = self.parsed[rel]
            for pos, segs, where in self.paths(code, mp):
                abs_ = self.resolve(segs, where)
                kind = "test" if whole_test or any(s <= pos < e for s, e in spans) else "lib"
                at = f"{rel}:{code.count(chr(10), 0, pos) + 1}"
                if (t := self.target(abs_)) and t != u:
                    edges.setdefault((u, t), {}).setdefault(kind, []).append(at)
                if self.kids[u] and (t := self.target(abs_, u)) and t != src_sub:
                    sub.setdefault((src_sub, t), {}).setdefault(kind, []).append(at)
        return edges, sub


def sccs(nodes, edges):
    """Tarjan: components of more than one node, each sorted."""
    adj = {n: sorted({b for a, b in edges if a == n}) for n in nodes}
    index, low, stack, on, out = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in adj.get(v, []):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v):]
            del stack[stack.index(v):]; on.difference_update(comp)
            if len(comp) > 1: out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for n in nodes:
        if n not in index: visit(n)
    return sorted(out)


def report(crate, order, drop=()):
    edges, sub = crate.graph()
    edges = {e: v for e, v in edges.items() if not set(e) & set(drop)}
    lib = {e: v["lib"] for e, v in edges.items() if "lib" in v}
    test = {e: v["test"] for e, v in edges.items() if "lib" not in v}
    ulines = {u: sum(n for r, n in crate.lines.items() if crate.files[r][0][:1] == [u]) for u in crate.units}
    total = sum(crate.lines.values())
    big = max(ulines, key=ulines.get) if ulines else None
    r = {"crate": crate.name, "units": len(crate.units), "lines": total, "unit_lines": ulines,
         "biggest": {"unit": big, "share": round(100 * ulines[big] / total, 1) if big else 0},
         "edges": {f"{a} -> {b}": sorted(set(v)) for (a, b), v in sorted(lib.items())},
         "test_only_edges": {f"{a} -> {b}": sorted(set(v)) for (a, b), v in sorted(test.items())},
         "circles": sccs(crate.units, lib), "order": order, "dropped": list(drop)}
    if order is not None:
        rank = lambda u: order.index(u) if u in order else len(order)
        r["back_up"] = {f"{a} -> {b}": sorted(set(v)) for (a, b), v in sorted(lib.items()) if rank(a) < rank(b)}
        r["order_missing"] = [u for u in order if u not in crate.units]
    sub_lib = {e for e, v in sub.items() if "lib" in v}
    r["folder_circles"] = {}
    for u in crate.units:
        nodes = [f"{u}::{k}" for k in sorted(crate.kids[u])] + ([f"{u}::(mod)"] if crate.has_root[u] else [])
        if crate.kids[u] and (c := sccs(nodes, {e for e in sub_lib if e[0].startswith(u + "::")})):
            r["folder_circles"][u] = c
    return r


def show(r):
    p = print
    b = r["biggest"]
    p(f"== {r['crate']}: {r['units']} units, {r['lines']} lines, biggest {b['unit']} {b['share']}%, "
      f"{len(r['edges'])} edges, {len(r['circles'])} circles, "
      + (f"{len(r['back_up'])} imports back up" if r["order"] is not None else "unknown order: no back-up count")
      + (f" (edges to or from {', '.join(r['dropped'])} left out)" if r["dropped"] else ""))
    p(f"  {'unit':<18}{'lines':>7}{'share':>7}  imports")
    for u, n in sorted(r["unit_lines"].items(), key=lambda x: -x[1]):
        out = [e.split(" -> ")[1] for e in r["edges"] if e.startswith(u + " -> ")]
        p(f"  {u:<18}{n:>7}{100 * n / r['lines']:>6.1f}%  {', '.join(out)}")
    if r["test_only_edges"]:
        p("  test-only: " + "; ".join(f"{e} ({len(v)})" for e, v in r["test_only_edges"].items()))
    for c in r["circles"]:
        p(f"  circle ({len(c)}): {', '.join(c)}")
    if r["order"] is not None:
        p(f"  order: {' < '.join(r['order'])}" + (f"  (absent: {', '.join(r['order_missing'])})" if r["order_missing"] else ""))
        for e, v in r["back_up"].items():
            p(f"  back up: {e}  [{', '.join(v[:6])}{', …' if len(v) > 6 else ''}]")
    for u, c in ((u, c) for u, cs in r["folder_circles"].items() for c in cs):
        p(f"  circle in {u}/ ({len(c)}): {', '.join(x.split('::', 1)[1] for x in c)}")
    p()


def crates(root):
    text = (root / "Cargo.toml").read_text()
    members = re.findall(r'"([^"]+)"', re.search(r"members\s*=\s*\[(.*?)\]", text, re.S).group(1))
    names = list(dict.fromkeys(members + [k for k in KNOWN if (root / k / "Cargo.toml").exists()]))
    for d in names:
        src = root / d / "src"
        if not ((src / "lib.rs").exists() or (src / "main.rs").exists()): continue
        toml = (root / d / "Cargo.toml").read_text()
        pkg = re.search(r'^name\s*=\s*"([^"]+)"', toml, re.M).group(1)
        lib = re.search(r'\[lib\][^\[]*?name\s*=\s*"([^"]+)"', toml)
        yield d, pkg, src, lib.group(1) if lib else pkg.replace("-", "_")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crate", help="crate directory or package name")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("--order", help="comma-separated layer order (lower first) for --crate")
    ap.add_argument("--drop", default="", help="units whose edges are left out, e.g. error,dtype")
    a = ap.parse_args()
    results = []
    for d, pkg, src, lib in crates(Path(a.root)):
        if a.crate and a.crate not in (d, pkg): continue
        order = a.order.split(",") if a.order else LAYERS.get(d, LAYERS.get(pkg))
        results.append(report(Crate(d, src, lib), order, [u for u in a.drop.split(",") if u]))
    if not results: sys.exit(f"no crate {a.crate!r} under {a.root}")
    if a.json: json.dump(results, sys.stdout, indent=1)
    else:
        for r in results: show(r)


if __name__ == "__main__":
    main()
