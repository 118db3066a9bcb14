from pyqsa.engine.detokenizer import Detokenizer


def feed(pieces: list[bytes], stop=()):
    d = Detokenizer(lambda t: pieces[t], tuple(stop))
    out = []
    for i in range(len(pieces)):
        text, hit = d.add(i)
        out.append(text)
        if hit:
            return out, True, ""
    return out, False, d.flush()


def test_multibyte_characters_split_across_tokens():
    euro = "€".encode()  # 3 bytes
    out, hit, rest = feed([b"a" + euro[:1], euro[1:2], euro[2:] + b"b"])
    assert out == ["a", "", "€b"]
    assert not hit and rest == ""


def test_incomplete_tail_is_replaced_at_the_end():
    out, _, rest = feed([b"x", "é".encode()[:1]])
    assert out == ["x", ""] and rest == "\ufffd"


def test_stop_string_across_token_boundaries_is_never_streamed():
    out, hit, _ = feed([b"Hello ", b"wor", b"ld", b"!"], stop=["world"])
    assert hit
    assert out == ["Hello ", "", ""]
    assert "".join(out) == "Hello "


def test_partial_stop_is_held_then_released():
    out, hit, rest = feed([b"ab", b"c", b"x"], stop=["cd"])
    assert not hit
    assert out == ["ab", "", "cx"]
    assert rest == ""


def test_held_text_is_flushed_at_the_end():
    out, hit, rest = feed([b"the en"], stop=["end"])
    assert out == ["the "] and not hit and rest == "en"


def test_earliest_of_several_stop_strings_wins():
    out, hit, _ = feed([b"xx STOP yy END"], stop=["END", "STOP"])
    assert hit and out == ["xx "]
