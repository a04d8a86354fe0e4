"""Chat templates rendered as transformers' ``apply_chat_template`` renders them, with jinja2
and no transformers at run time.

A chat template is Jinja code shipped with a tokenizer (``tokenizer_config.json``'s
``chat_template``, or ``chat_template.jinja`` / ``chat_template.json`` beside it). transformers
compiles it in an immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that does not HTML-escape, and the globals
``raise_exception``, ``strftime_now``, ``dict`` and a ``namespace`` that refuses
underscore-prefixed names; it renders with ``messages``, ``tools``, ``documents``,
``add_generation_prompt``, the tokenizer's named special tokens (``bos_token``,
``eos_token`` …) and the caller's keywords (``enable_thinking=False`` for FLUX.2 klein).
:func:`render_chat_template` does the same, so the text — and so the token ids — are the same.

The FLUX.2 pipelines only ever render text messages; the ``{% generation %}`` tag of
training templates is accepted and renders its body (no assistant mask is tracked).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from ditax.errors import ConfigError, RequestError


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %} … {% endgeneration %}``: rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """Jinja's namespace without underscore-prefixed names (no reach into internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for key in attrs:
                Namespace._check(key)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, key, value):
            Namespace._check(key)
            jinja2.utils.Namespace.__setitem__(self, key, value)

        @staticmethod
        def _check(key):
            if isinstance(key, str) and key.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot set underscore-prefixed names ({key!r})")

    class Dict:
        """``dict(...)`` and ``dict.fromkeys(...)`` without the class itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=Dict(), namespace=Namespace)
    return env


@lru_cache(maxsize=16)
def compile_template(source: str):
    """The compiled template of ``source`` (cached: the pipelines render one per prompt); a
    :class:`ConfigError` naming the syntax error otherwise."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"the chat template does not compile: {e.message} (line {e.lineno}); "
                          f"fix chat_template in the tokenizer folder") from None


def _plain(value):
    """``value`` rebuilt from plain JSON types (what the template may see)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    for kind in (str, bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    return f"<{type(value).__name__}>"


def render_chat_template(source: str, conversations, *, add_generation_prompt: bool = False,
           special_tokens: dict | None = None, **kwargs) -> list[str]:
    """Render ``conversations`` (a list of conversations, each a list of ``{"role",
    "content", ...}`` dicts) with the chat template ``source`` → one string each.

    ``special_tokens``: the tokenizer's named tokens (``bos_token`` …), seen by the template
    like the caller's ``kwargs`` (which win). A message's keys whose value is None are
    dropped first, as transformers does. Template errors (its own ``raise_exception``
    included) are a :class:`RequestError` naming the message."""
    import jinja2

    template = compile_template(source)
    context = _plain({**(special_tokens or {}), **kwargs})
    out = []
    for chat in conversations:
        if not isinstance(chat, (list, tuple)) or not chat:
            raise RequestError(f"a conversation must be a non-empty list of message dicts; "
                               f"got {chat!r}")
        messages = []
        for m in chat:
            if not isinstance(m, dict):
                raise RequestError(f"chat messages must be dicts; got {m!r}")
            messages.append(_plain({k: v for k, v in m.items() if v is not None}))
        try:
            out.append(template.render(messages=messages, tools=None, documents=None,
                                       add_generation_prompt=add_generation_prompt, **context))
        except jinja2.TemplateError as e:
            raise RequestError(f"the chat template refused the messages: {e}") from None
    return out


__all__ = ["compile_template", "render_chat_template"]
