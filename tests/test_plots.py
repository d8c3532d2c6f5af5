"""lpfail.book.plots: one colour per variant, figures cut into panels that carry their text sizes."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lpfail.book import plots  # noqa: E402


def test_one_colour_per_variant():
    from lpfail.sweep.variants import VARIANTS

    missing = [v for v in VARIANTS if v not in plots.PALETTE]
    assert not missing, f"variants without a colour: {missing}"
    colours = list(plots.PALETTE.values())
    assert len(set(colours)) == len(colours), "two variants share a colour"
    assert all(a in plots.PALETTE or plots.ALIASES[a] in plots.PALETTE for a in plots.ALIASES)
    assert plots.color("ref_PAPER_BF16") == plots.color("A") == plots.style("A")["color"]
    with pytest.raises(KeyError, match="no colour"):
        plots.color("no such variant")


def test_panels_carry_their_text_sizes_and_a_small_font_is_seen():
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.plot([0, 1], [0, 1], label="x")
    a.legend()
    b.plot([0, 1], [1, 0])
    b.set_title("tiny", fontsize=6)
    imgs = plots.panel_images(fig)
    assert len(imgs) == 2 and all(p["png"][:4] == b"\x89PNG" for p in imgs)
    assert imgs[0]["legend_pt"] == plots.RC["legend.fontsize"] and imgs[1]["legend_pt"] is None
    assert imgs[0]["min_pt"] >= plots.MIN_PT and imgs[1]["min_pt"] == 6  # the negative control
    assert all(p["width_in"] < 4.5 for p in imgs)  # each half of the figure, not all of it
    html = plots.figure_html(fig, "two panels")
    assert html.count("<img") == 2 and 'data-lp-legend-pt="9"' in html and 'data-lp-text-pt="6"' in html


def test_stacked_axes_on_a_shared_x_are_one_panel_and_figure_legends_are_refused():
    fig, (a, b) = plt.subplots(2, 1, sharex=True)
    a.plot([0, 1])
    b.plot([1, 0])
    assert len(plots.panels(fig)) == 1
    fig2, ax = plt.subplots()
    ax.plot([0, 1], label="x")
    fig2.legend()
    with pytest.raises(ValueError, match="figure-level legend"):
        plots.panels(fig2)
    plt.close("all")


def test_the_causal_chain_reads_on_a_phone():
    links = [{"text": "Biased rounding of P̄V", "chapter": "ch. 4", "status": s} for s in plots.STATUS_COLORS]
    (p,) = plots.panel_images(plots.causal_chain(links))
    assert p["width_in"] <= plots.MAX_PANEL_IN and p["min_pt"] >= plots.MIN_PT


def test_step_figure_draws_each_method_and_mode_from_a_stored_shape():
    import numpy as np
    pytest.importorskip("triton")
    methods = ["sdpa", "dropin", "dropin_robust", "dropin_dqa", "dropin_dqa_robust"]
    tps = np.full((2, 5, 3), 100.0)
    tps[:, 1:] = 92.0
    tps[1, 4] = np.nan                        # a method not measured compiled: no bar, no error
    res = {"tokens_per_s": tps, "methods": np.array(methods), "modes": np.array(["eager", "compiled"])}
    from lpfail.book import kernel_plots as KP
    fig = KP.step_figure(res)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_width() > 0 and p.get_height() < 1]
    assert len(bars) == 4 * 2 - 1 and {round(b.get_width(), 3) for b in bars} == {0.92}
    assert [t.get_text() for t in ax.get_yticklabels()] == [plots.WORDS[m] for m in methods[1:]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["eager", "compiled"]
    plt.close(fig)
