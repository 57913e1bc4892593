"""Path templates of google.api.http, matched against raw (percent-encoded) paths."""
import pytest

from gateway.pathtemplate import TemplateError, parse


def test_variables_and_verb():
    t = parse("/v1/salons/{salon_id}/slots:batchCreate")
    assert t.variables == ("salon_id",)
    assert t.verb == "batchCreate"
    assert t.match("/v1/salons/s-1/slots:batchCreate") == {"salon_id": "s-1"}
    assert t.match("/v1/salons/s-1/slots") is None
    assert t.match("/v1/salons/s-1/slots:batchDelete") is None
    assert t.match("/v1/salons//slots:batchCreate") is None


def test_verb_on_a_variable_segment():
    pay = parse("/v1/checkouts/{checkout_id}:pay")
    assert pay.match("/v1/checkouts/abc:pay") == {"checkout_id": "abc"}
    assert pay.match("/v1/checkouts/abc:cancel") is None
    assert pay.match("/v1/checkouts/abc") is None


def test_single_segment_variable_decodes_everything():
    t = parse("/v1/checkouts/{checkout_id}")
    assert t.match("/v1/checkouts/a%2Fb%20c") == {"checkout_id": "a/b c"}
    assert t.match("/v1/checkouts/a/b") is None  # a real slash is a second segment


def test_multi_segment_variable_keeps_encoded_slash():
    t = parse("/v1/{name=files/**}")
    assert t.multi == (True,)
    assert t.match("/v1/files/a/b%2Fc") == {"name": "files/a/b%2Fc"}


def test_nested_field_path_and_literal_wildcard():
    t = parse("/v1/{shelf.id}/books/*")
    assert t.variables == ("shelf.id",)
    assert t.match("/v1/s1/books/anything") == {"shelf.id": "s1"}


def test_no_regex_injection_from_literals():
    t = parse("/v1/a.b")
    assert t.match("/v1/a.b") == {}
    assert t.match("/v1/aXb") is None


@pytest.mark.parametrize("bad", ["v1/x", "/v1/{x", "/v1/{1x}", "/v1/{a}/{a}", "/v1//x", "/v1/x:{y}"])
def test_bad_templates_are_refused(bad):
    with pytest.raises(TemplateError):
        parse(bad)


def test_specificity_prefers_verbs_and_literals():
    assert parse("/v1/checkouts/{id}:pay").specificity > parse("/v1/checkouts/{id}").specificity


def test_openapi_path():
    assert parse("/v1/{name=files/**}:get").openapi_path == "/v1/{name}:get"
