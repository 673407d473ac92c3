"""The answer table's labels: a long, evenly spaced burst schedule is said by its step and span."""

from dblp.results.analysis import bursts_text


def test_short_or_uneven_burst_lists_stay_as_they_are():
    assert bursts_text([50, 110]) == "50,110"
    assert bursts_text([20, 40, 60, 80]) == "20,40,60,80"
    assert bursts_text([10, 20, 30, 45, 60]) == "10,20,30,45,60"
    assert bursts_text([]) == ""


def test_an_evenly_spaced_long_list_is_its_step_and_span():
    assert bursts_text(range(25, 1176, 25)) == "every 25 from 25 to 1175 (47)"
    assert bursts_text([20, 40, 60, 80, 100, 120, 140]) == "every 20 from 20 to 140 (7)"
