"""CPU: ops.common.switches.knob_specs, the parser of the knobs on trial (TOPK_KNOBS, bench/ab_topk.py --knobs):
ints, negative ints, ':' tuples and strings come back as such, so a tuple knob (REFINE_DIGITS) never reaches a kernel
as a string."""
from ops.common.switches import choice, knob_specs, knob_value


def test_knob_values():
    assert knob_value("2") == 2 and knob_value("-1") == -1
    assert knob_value("11:10") == (11, 10) and knob_value("7:7:7") == (7, 7, 7)
    assert knob_value("key") == "key" and knob_value("a:b") == "a:b"


def test_knob_specs():
    assert knob_specs("") == {} and knob_specs(None) == {}
    assert knob_specs("L2_START=2,REFINE_DIGITS=11:10,SORT=key") == {"L2_START": 2, "REFINE_DIGITS": (11, 10),
                                                                     "SORT": "key"}


def test_choice_still_checks():
    assert choice(None, "X", ("a", "b")) == "a"
