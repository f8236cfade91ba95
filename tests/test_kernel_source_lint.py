"""CPU CI: source checks of the kernel modules (ops/) that catch a bug class before any GPU runs.

No loop variable shadows a parameter of its function. A CuTe DSL kernel helper is traced as plain Python: an unrolled
`for c in cutlass.range_constexpr(n)` inside a function with a parameter `c` leaves `c` bound to the last column index
(a compile-time constant) for everything after the loop, and the traced code uses that constant silently. Seen on
2026-12-07 (branch wip/fwd-fold-poly, H100): online_softmax_finalize's parameter `c` (the softmax scale folded into
the exponent) was shadowed by its column loop, so the second of a thread's two rows took lse = ln 2 (15 M + log2 l);
test_flash_fwd.py failed 152 of 176 cases on it. This test flags that source.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shadowed_parameters(source, name="<source>"):
    """'file:line function: name' for every for-loop or comprehension target that rebinds a parameter of the
    function it sits in."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
        for node in ast.walk(fn):
            if isinstance(node, (ast.For, ast.comprehension)):
                for n in ast.walk(node.target):
                    if isinstance(n, ast.Name) and n.id in params:
                        found.append(f"{name}:{n.lineno} {fn.name}: loop variable {n.id!r} shadows a parameter")
    return found


def test_no_loop_variable_shadows_a_parameter():
    found = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "ops")):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                with open(path) as fh:
                    found += shadowed_parameters(fh.read(), os.path.relpath(path, ROOT))
    assert not found, "\n".join(found)


def test_the_check_sees_the_2026_12_07_bug():
    buggy = (
        "def online_softmax_finalize(o_mn, row_max, row_sum, lse_out, c):\n"
        "    for r in range(2):\n"
        "        lse_out[r] = row_max[r] * c\n"
        "        for c in range(16):\n"
        "            o_mn[r, c] = o_mn[r, c]\n")
    assert shadowed_parameters(buggy) == ["<source>:4 online_softmax_finalize: loop variable 'c' shadows a parameter"]
    assert shadowed_parameters(buggy.replace("for c in range(16)", "for j in range(16)")) == []
