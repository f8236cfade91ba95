"""tests/gpu/lpt_pick.py, the rule that decides whether LPT_MB becomes a flash kernel's default (tests/gpu/lpt_call.sh),
on tables written in the exact line formats of bench/ab_flash_fwd.py and bench/ab_flash_bwd.py."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("lpt_pick", os.path.join(ROOT, "tests", "gpu", "lpt_pick.py"))
lpt_pick = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lpt_pick)


def fwd_line(spec, causal, knob, ratio, out_diff=0.0, lse_diff=0.0, nan=False):
    # bench/ab_flash_fwd.py's row format (t0 / t1 = ratio)
    t0, t1 = 1.0, 1.0 / ratio
    return (f"{'D%s %s' % (spec, 'causal' if causal else 'full'):16s} {knob[:28]:28s} {100 / t0:6.1f} TF "
            f"{100 / t1:6.1f} TF {t0 / t1:6.3f}  {out_diff:.1e} / {lse_diff:.1e}{'  NaN!' if nan else ''}")


def bwd_line(D, causal, ordered, knob, ratio, same=True, dq=0.0, nan=False):
    # bench/ab_flash_bwd.py's row format
    t0, t1 = 1.0, 1.0 / ratio
    name = f"D{D} {'causal' if causal else 'full'}{' ordered' if ordered else ''}"
    return (f"{name:30s} {knob[:24]:24s} {100 / t0:6.1f} TF {100 / t1:6.1f} TF "
            f"{t0 / t1:6.3f}  {same} / {dq:.1e}{'  NaN!' if nan else ''}")


def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("# header\nrow knob set default knobs ratio\n" + "\n".join(lines) + "\n")
    return str(p)


def fwd_table(r24_causal, r8_causal, full=1.0, **bad):
    lines = []
    for D in ("128", "64"):
        for causal in (False, True):
            lines.append(fwd_line(D, causal, "LPT_MB=24", r24_causal if causal else full, **bad))
            lines.append(fwd_line(D, causal, "LPT_MB=8", r8_causal if causal else full))
    return lines


def bwd_table(r24_causal, r24_full=1.0, same=True, ordered_dq=0.0, ordered_ratio=1.0):
    lines = []
    for D in (128, 64):
        for causal in (False, True):
            for ordered in (False, True):
                r = ordered_ratio if ordered else (r24_causal if causal else r24_full)
                lines.append(bwd_line(D, causal, ordered, "LPT_MB=24", r, same,
                                      ordered_dq if ordered else 3e-7))
    return lines


def picks(tmp_path, capsys, fwd, bwd):
    lpt_pick.main(write(tmp_path, "f.txt", fwd), write(tmp_path, "b.txt", bwd))
    out = capsys.readouterr().out
    got = dict(line.split(": ", 1) for line in out.splitlines() if line.endswith(("none", "=24", "=8"))
               and line.startswith(("forward pick", "backward pick")))
    return got["forward pick"], got["backward pick"]


def test_rows_parse_in_both_formats(tmp_path):
    assert len(lpt_pick.rows(write(tmp_path, "f.txt", fwd_table(1.05, 1.02)))) == 8
    b = lpt_pick.rows(write(tmp_path, "b.txt", bwd_table(1.04)))
    assert len(b) == 8 and sum(r["ordered"] for r in b) == 4


def test_the_faster_winning_set_is_picked(tmp_path, capsys):
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.08), bwd_table(1.04)) == ("LPT_MB=8", "LPT_MB=24")


@pytest.mark.parametrize("gain", [1.0, 1.009, 0.97])
def test_no_pick_without_a_causal_gain(tmp_path, capsys, gain):
    assert picks(tmp_path, capsys, fwd_table(gain, gain), bwd_table(gain)) == ("none", "none")


def test_a_slower_changed_row_vetoes(tmp_path, capsys):
    # the backward's full rows are changed by the order (which heads share L2): one at 0.98x vetoes
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0), bwd_table(1.05, r24_full=0.98))[1] == "none"
    # the forward's full rows are not (unmasked variants keep their order): noise there does not veto
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0, full=0.98), bwd_table(1.05))[0] == "LPT_MB=24"


def test_outputs_must_be_bit_equal(tmp_path, capsys):
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0, out_diff=1e-7), bwd_table(1.05))[0] == "none"
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0, nan=True), bwd_table(1.05))[0] == "none"
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0), bwd_table(1.05, same="2.0e-03"))[1] == "none"
    # the ordered backward keeps its order: its dQ must be equal too
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0), bwd_table(1.05, ordered_dq=1e-7))[1] == "none"


def test_a_gain_within_the_runs_noise_is_no_win(tmp_path, capsys):
    # 12-08 (H100): the backward's LPT_MB 8, a no-op at D 128, "won" at 1.011 while the ordered rows, which the order
    # leaves alone, moved by 1.5 %: a gain must stand twice the noise clear of 1
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0), bwd_table(1.011, ordered_ratio=0.985))[1] == "none"
    assert picks(tmp_path, capsys, fwd_table(1.05, 1.0), bwd_table(1.04, ordered_ratio=0.985))[1] == "LPT_MB=24"
    # the forward's noise comes from its full rows
    assert picks(tmp_path, capsys, fwd_table(1.03, 1.02, full=0.98), bwd_table(1.04))[0] == "none"
