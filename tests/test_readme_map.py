"""README.md's rows for `lpfail/experiments/*` are generated from the experiments (`lpfail.book.readme`): the block
between its markers is exactly what the function gives, and the function's parts do what they say."""
import re

from lpfail.book import readme


def test_readme_experiments_map_is_generated_from_the_registry():
    text = readme.README.read_text(encoding="utf-8")
    assert text.count(readme.BEGIN) == 1 and text.count(readme.END) == 1
    assert readme.current(text) == readme.block(), (
        f"README.md's experiments map differs from the experiments' docstrings and registrations: run "
        f"`{readme.COMMAND}` (from the repository root, with the venv's python) and commit README.md")


def test_every_experiment_module_has_a_row_and_every_registered_experiment_is_named():
    from lpfail import results

    block = readme.block()
    for module in readme.modules():
        assert f"| `{module.replace('.', '/')}.py` |" in block
    for name, e in results.registry().items():
        if e.fn.__module__.startswith(readme.PACKAGE + "."):
            assert f"`{name}` (" in block, name


def test_cells_escape_pipes_and_keep_one_line():
    assert readme.cell("a | b\nc") == r"a \| b c"
    assert readme.cell(r"already \| escaped") == r"already \| escaped"
    row = "| x | " + readme.cell("status | plan") + " |"
    assert len(re.findall(r"(?<!\\)\|", row)) == 3  # two cells: the escaped pipe splits none


def test_opening_is_the_first_paragraph_or_its_first_sentence():
    assert readme.opening("Short one. Two.\n\nMore.") == "Short one. Two."
    long = "First sentence, e.g. with an abbreviation. Then " + "x " * 200
    assert readme.opening(long) == "First sentence, e.g. with an abbreviation."
    assert readme.opening(None) == ""


def test_update_rewrites_only_the_block(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"# title\n\nbefore\n\n{readme.BEGIN}\n| old |\n{readme.END}\n\nafter\n", encoding="utf-8")
    assert readme.update(path) is True
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert readme.current(text) == readme.block()
    assert readme.update(path) is False
