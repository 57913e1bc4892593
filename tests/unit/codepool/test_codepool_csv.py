"""Supplier CSV files: header or not, malformed lines by number, streaming chunks."""
import pytest

from cutylib.errors import InvalidArgument
from codepool import csvfile


def write(tmp_path, text: str, name="c.csv"):
    p = tmp_path / name
    p.write_bytes(text.encode("utf-8"))
    return p


def test_headerless_single_column(tmp_path):
    p = write(tmp_path, "AAA-1\nBBB-2\n\nCCC-3")
    check = csvfile.check_file(p)
    assert (check.codes, check.error_count) == (3, 0)
    assert list(csvfile.read_codes(p, chunk=2)) == [["AAA-1", "BBB-2"], ["CCC-3"]]


def test_header_with_code_column_and_bom_and_quotes(tmp_path):
    p = write(tmp_path, "\ufeffserial,Code\r\n1,\"AAA,1\"\r\n2,  BBB-2  \r\n")
    check = csvfile.check_file(p)
    assert (check.codes, check.error_count) == (2, 0)
    assert list(csvfile.read_codes(p)) == [["AAA,1", "BBB-2"]]


def test_malformed_lines_reported_by_number(tmp_path):
    p = write(tmp_path, "code\nA-1\nB-2,extra\n\"\"\nC-3\n" + "x" * 300 + "\nD\x01\n")
    check = csvfile.check_file(p)
    assert check.codes == 2
    assert check.errors == [(3, "expected 1 column(s), got 2"), (4, "code is empty"),
                            (6, "code is longer than 256 characters (got 300)"), (7, "code contains a control character")]
    with pytest.raises(InvalidArgument) as e:
        check.raise_if_bad("c.csv")
    assert e.value.field == "line 3" and "4 malformed line(s)" in e.value.message


def test_broken_quote_and_bad_encoding(tmp_path):
    check = csvfile.check_file(write(tmp_path, 'A-1\n"B-2\nC-3\n'))
    assert check.errors and check.errors[0][0] == 2 and "malformed CSV" in check.errors[0][1]
    p = tmp_path / "latin1.csv"
    p.write_bytes(b"A-1\nB\xff-2\n")
    check = csvfile.check_file(p)
    assert check.errors and "UTF-8" in check.errors[0][1]


def test_many_errors_are_summarised(tmp_path):
    p = write(tmp_path, "\n".join(["a,b"] * 50))
    check = csvfile.check_file(p)
    with pytest.raises(InvalidArgument) as e:
        check.raise_if_bad("c.csv")
    assert "50 malformed" in e.value.message and "and 30 more" in e.value.message
