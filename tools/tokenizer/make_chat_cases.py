#!/usr/bin/python3
"""Writes tests/data/tokenizer/chat/cases.json: chat-template cases rendered by Jinja2.

Jinja2 is set up exactly as transformers' apply_chat_template sets it up
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, the {% generation %}
tag, its own `tojson`, raise_exception, strftime_now) and called with the same variables
(messages, tools, documents, add_generation_prompt, the special tokens, extra kwargs).
Each case stores Jinja2's output, or the error it raised; the C++ test must reproduce the
output byte for byte, or fail too.

Run with Debian's python3-jinja2: /usr/bin/python3 tools/tokenizer/make_chat_cases.py
"""
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "..", "..", "tests", "data", "tokenizer", "chat")
TEMPLATES = {"qwen3": "qwen3.jinja", "qwen35_style": "qwen35_style.jinja"}
SPECIAL = {"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"}


class GenerationTag(Extension):
    """transformers' AssistantTracker without tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "(time)"
    return env


ENV = make_env()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns \"snippets\".",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "max_results": {"type": "integer", "default": 5, "minimum": 1},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "since": {"type": ["string", "null"]}}},
        "score": {"type": "number", "default": 0.5}}, "required": ["query"]}}}
BARE_TOOL = {"name": "calculator", "description": "Evaluate arithmetic", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "What's the weather in Zürich? Answer in °C."}
A1 = {"role": "assistant", "content": "It is 21 °C and sunny in Zürich."}
U2 = {"role": "user", "content": "And in 東京 (Tokyo)? 🌧️"}
CALL_WEATHER = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]}
CALL_TWO = {"role": "assistant", "content": "Let me check both.", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}},
    {"type": "function", "function": {"name": "search", "arguments": {"query": "Tokyo rain", "max_results": 3,
                                                                       "filters": {"lang": "ja", "since": None},
                                                                       "score": 0.75}}}]}
CALL_STRING_ARGS = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"raw json\"}"}}]}
TOOL1 = {"role": "tool", "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"}
TOOL2 = {"role": "tool", "content": "Rain, 17 °C"}
THINK_A = {"role": "assistant", "content": "<think>\nThe user wants weather.\nI know it.\n</think>\n\nIt is sunny."}
REASON_A = {"role": "assistant", "content": "Sunny.", "reasoning_content": "Check the forecast first."}
MULTI = {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image", "image": "a.png"},
                                     {"type": "text", "text": " and "}, {"type": "video", "video": "b.mp4"}]}
LONG = {"role": "user", "content": "Line one\n\n  indented line\ttab\r\nwindows line\n" + "lorem ipsum " * 30}

CONVERSATIONS = [
    ("single_user", [U1], {}),
    ("system_user", [SYS, U1], {}),
    ("two_turns", [SYS, U1, A1, U2], {}),
    ("no_generation_prompt", [SYS, U1, A1], {"add_generation_prompt": False}),
    ("thinking_off", [U1], {"extra": {"enable_thinking": False}}),
    ("thinking_on", [U1], {"extra": {"enable_thinking": True}}),
    ("thinking_off_multi", [SYS, U1, A1, U2], {"extra": {"enable_thinking": False}}),
    ("history_with_think", [U1, THINK_A, U2], {}),
    ("last_turn_think", [U1, THINK_A], {"add_generation_prompt": False}),
    ("reasoning_content", [U1, REASON_A, U2], {}),
    ("reasoning_content_last", [U1, REASON_A], {"add_generation_prompt": False}),
    ("tools_no_system", [U1], {"tools": [WEATHER]}),
    ("tools_with_system", [SYS, U1], {"tools": [WEATHER, SEARCH]}),
    ("tool_call_and_result", [SYS, U1, CALL_WEATHER, TOOL1], {"tools": [WEATHER]}),
    ("tool_call_answer", [U1, CALL_WEATHER, TOOL1, A1, U2], {"tools": [WEATHER]}),
    ("two_calls_two_results", [U2, CALL_TWO, TOOL1, TOOL2], {"tools": [WEATHER, SEARCH]}),
    ("two_calls_thinking_off", [U2, CALL_TWO, TOOL1, TOOL2], {"tools": [WEATHER, SEARCH], "extra": {"enable_thinking": False}}),
    ("string_arguments", [U1, CALL_STRING_ARGS, TOOL2], {"tools": [SEARCH]}),
    ("bare_tool_schema", [U1], {"tools": [BARE_TOOL]}),
    ("empty_tools_list", [SYS, U1], {"tools": []}),
    ("tool_result_then_user", [U1, CALL_WEATHER, TOOL1, {"role": "user", "content": "<tool_response>x</tool_response>"}], {}),
    ("long_whitespace", [SYS, LONG], {}),
    ("unicode_everywhere", [{"role": "system", "content": "Réponds en français — «toujours»."},
                            {"role": "user", "content": "Ça va ? 你好 👋🏽 \u00a0nbsp \u2028sep"}], {}),
    ("empty_user", [{"role": "user", "content": ""}], {}),
    ("system_only", [SYS], {}),
    ("assistant_prefill", [U1, {"role": "assistant", "content": "Sure"}], {"add_generation_prompt": False}),
    ("second_system_message", [SYS, U1, {"role": "system", "content": "Be brief."}, U2], {}),
    ("think_in_history_tools", [U1, THINK_A, U2, CALL_WEATHER, TOOL1], {"tools": [WEATHER]}),
    ("reasoning_with_call", [U1, dict(CALL_TWO, reasoning_content="Two lookups."), TOOL1, TOOL2], {"tools": [WEATHER, SEARCH]}),
    ("many_turns", [SYS] + [m for i in range(6) for m in ({"role": "user", "content": f"Question {i}?"},
                                                           {"role": "assistant", "content": f"Answer {i}."})] + [U2], {}),
    ("quotes_and_braces", [{"role": "user", "content": "Use {{ braces }} and {% tags %} and 'quotes' \"too\" \\ backslash"}], {}),
    ("extra_unused_kwargs", [U1], {"extra": {"custom_flag": True, "date_string": "26 Jul 2024"}}),
]
QWEN35_ONLY = [
    ("multimodal_content", [SYS, MULTI], {}),
    ("multimodal_vision_ids", [MULTI, A1, MULTI], {"extra": {"add_vision_id": True}}),
    ("effort_medium", [SYS, U1], {"extra": {"reasoning_effort": "medium"}}),
    ("effort_low_no_system", [U1], {"extra": {"reasoning_effort": "LOW "}}),
    ("effort_high_maps_to_xhigh", [SYS, U1], {"extra": {"reasoning_effort": "high"}}),
    ("effort_low_tools", [U1], {"tools": [WEATHER], "extra": {"reasoning_effort": "low"}}),
    ("preserve_thinking_false", [U1, THINK_A, U2, REASON_A], {"add_generation_prompt": False, "extra": {"preserve_thinking": False}}),
    ("effort_invalid", [U1], {"extra": {"reasoning_effort": "extreme"}}),
    ("no_messages", [], {}),
    ("bad_role", [{"role": "narrator", "content": "x"}], {}),
    ("late_system", [U1, SYS], {}),
    ("content_none_with_call", [U1, dict(CALL_WEATHER, content=None), TOOL1], {"tools": [WEATHER]}),
]
QWEN3_ERRORS = [
    ("content_none_with_call", [U1, dict(CALL_WEATHER, content=None), TOOL1], {"tools": [WEATHER]}),
]

# Feature snippets: small templates that pin down one Jinja2 behaviour each.
SNIPPETS = [
    ("ws_trim_lstrip", "  {% if true %}\n  yes\n  {% endif %}\nafter\n", {}),
    ("ws_minus", "a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("ws_plus", "  {%+ if true +%}\nx\n{% endif %}", {}),
    ("ws_var_minus", "x  {{- 'y' -}}  \n z {{ 'w' }}\n", {}),
    ("ws_comment", "a\n  {# comment #}\nb {#- c -#} d\n", {}),
    ("ws_crlf_and_trailing_newline", "line1\r\n{% if true %}\r\nline2\r\n{% endif %}\r\n", {}),
    ("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}!", {}),
    ("literals_and_repr", "{{ [1, 'a', none, true, 2.5, {'k': (1,)}] }}|{{ (1,) }}|{{ () }}|{{ {} }}|{{ none }}|{{ 1e16 }}|{{ 0.0001 }}|{{ 1e-5 }}|{{ 3.0 }}|{{ -0.5 }}|{{ 123456789.125 }}", {}),
    ("string_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n', 'é😀', '\\x07'] }}", {}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2 * 3 - 4 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 10 / 4 * 2 }}", {}),
    ("concat_and_strings", "{{ 'a' ~ 1 ~ none ~ [1] }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'x' + 'y' }} {{ 'abc'[1] }} {{ 'héllo'[::-1] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::2] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3][5:] }}", {}),
    ("comparisons", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }} {{ none == none }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ 'b' > 'a' }} {{ true == 1 }}", {}),
    ("logic_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] or 0 }} {{ not '' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}]", {}),
    ("loop_vars", "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o','e') }};{% endfor %}", {}),
    ("loop_filter_else", "{% for x in range(10) if x is odd %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_unpack_items", "{% for k, v in {'b': 1, 'a': [2]}.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in {'z': 0, 'y': 1} | items %}{{ k }}{{ v }}{% endfor %}{% for k in {'q': 1, 'p': 2} %}{{ k }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("namespace", "{% set ns = namespace(count=0, items=[]) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.count }} {{ ns.items }}", {}),
    ("macro_defaults_kwargs", "{% macro m(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m('x', c=3) }}{{ m(b='k', a='j') }}", {}),
    ("macro_recursion", "{% macro count(n) %}{{ n }}{% if n > 0 %},{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(4) }}", {}),
    ("set_block_filter", "{% set body | trim | upper %}\n  hello world  \n{% endset %}[{{ body }}]{% set plain %}a{{ 1 }}b{% endset %}{{ plain }}", {}),
    ("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("tojson_forms", "{{ obj | tojson }}\n{{ obj | tojson(indent=2) }}\n{{ obj | tojson(indent='\\t') }}\n{{ obj | tojson(sort_keys=true) }}\n{{ obj | tojson(separators=(',', ':')) }}\n{{ obj | tojson(ensure_ascii=true) }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson }}",
     {"obj": {"z": 1, "a": [1.5, 2e-7, 1e22, -0.0, True, None], "u": "Zürich \"q\" \\ \n\t\u0001 😀 \u2028", "e": {}, "n": {"x": []}}}),
    ("tojson_numbers", "{{ [1, -1, 3.14159, 100.0, 1e100, 12345678901234567] | tojson }}", {}),
    ("string_methods", "{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nA\\n'.lstrip('\\n') }}|{{ 'ab--'.rstrip('-') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b\\tc '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a/b/c'.rsplit('/', 1) }}|{{ 'x\\ny\\r\\nz'.splitlines() }}|{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'MiXed'.upper() }}{{ 'MiXed'.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'héllo'.find('l') }}|{{ 'banana'.count('an') }}|{{ '-'.join(['a', 'b']) }}|{{ '123'.isdigit() }}{{ 'a1'.isalpha() }}", {}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }} {{ d['b'] }} {{ d.b }}", {"d": {"a": 1, "b": "two"}}),
    ("filters_text", "{{ 'hello world' | title }}|{{ 'x-ray (test) [a]' | title }}|{{ 'hi' | capitalize }}|{{ '  t  ' | trim }}|{{ 'xxtxx' | trim('x') }}|{{ 'aXb' | lower }}{{ 'aXb' | upper }}|{{ 'abc' | replace('b', '-') }}|{{ 'abc' | reverse }}|{{ 'a b  c' | wordcount }}|{{ 'ab' | center(6) }}|{{ '<a href=\"x\">&\\'' | e }}|{{ 'one\\ntwo\\n\\nthree' | indent(2) }}|{{ 'one\\ntwo' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}", {}),
    ("filters_lists", "{{ [3, 1, 2] | sort }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}|{{ [3, 1, 2] | sort(reverse=true) }}|{{ [1, 2, 2, 'a', 'A'] | unique | list }}|{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}|{{ [1, 2, 3] | length }}{{ 'héllo' | length }}{{ {'a': 1} | count }}|{{ [1, 2, 3] | sum }}{{ [1.5, 2] | sum }}|{{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }}|{{ ['a', 'b'] | join(', ') }}|{{ [1, 2] | join }}|{{ 'abc' | list }}|{{ [1, 2, 3] | reverse | list }}", {}),
    ("filters_select_map", "{{ users | map(attribute='name') | join(',') }}|{{ users | selectattr('active') | map(attribute='name') | list }}|{{ users | rejectattr('active') | map(attribute='name') | list }}|{{ users | selectattr('age', 'gt', 30) | map(attribute='name') | list }}|{{ [1, 2, 3, 4] | select('even') | list }}|{{ [1, 0, none, 'x'] | select | list }}|{{ [1, 2, 3] | reject('odd') | list }}|{{ ['a', 'b'] | map('upper') | list }}|{{ users | sort(attribute='age') | map(attribute='name') | list }}|{{ users | map(attribute='missing', default='?') | list }}|{{ users | selectattr('name', 'equalto', 'bo') | list | length }}",
     {"users": [{"name": "al", "active": True, "age": 41}, {"name": "bo", "active": False, "age": 25}, {"name": "cy", "active": True, "age": 33}]}),
    ("filters_convert", "{{ '42' | int }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ '0x1A' | int(0, 16) }} {{ 4.7 | int }} {{ '2.5' | float }} {{ 'x' | float }} {{ 3 | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 2.1 | round(method='ceil') }} {{ -3 | abs }} {{ 5 | string }}{{ none | string }} {{ true | int }}", {}),
    ("filters_default_dict", "{{ missing | default('dflt') }} {{ '' | default('empty', true) }} {{ none | default('n') }} {{ 0 | d('zero', boolean=true) }} {{ {'b': 2, 'a': 1, 'C': 3} | dictsort }} {{ {'b': 2, 'a': 1} | dictsort(by='value', reverse=true) }} {{ {'k': 'v'} | items | list }}", {}),
    ("tests", "{{ 1 is odd }}{{ 2 is even }}{{ 9 is divisibleby 3 }}{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ true is integer }}{{ true is boolean }}{{ false is false }}{{ {} is mapping }}{{ [] is iterable }}{{ 'x' is iterable }}{{ y is iterable }}{{ [] is sequence }}{{ 1 is iterable }}{{ x is callable }}{{ range is callable }}{{ 'abc' is lower }}{{ 'A' is upper }}{{ 2 is in [1, 2] }}{{ 3 is gt 2 }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 'x' is not none }}{{ none is sameas none }}",
     {"x": 5}),
    ("undefined_behaviour", "[{{ missing }}][{{ missing | length }}][{% for x in missing %}{{ x }}{% endfor %}][{{ missing is defined }}][{{ 'a' in missing }}][{{ d.nokey }}][{{ d.nokey is defined }}][{{ d['nokey'] | default('dk') }}][{% if missing %}t{% else %}f{% endif %}][{{ none.attr is defined }}]", {"d": {}}),
    ("attribute_item_forms", "{{ l.0 }} {{ l[1] }} {{ l[-1] }} {{ l[9] is defined }} {{ d['a'].b }} {{ d.a['b'] }} {{ d.get('a').b }} {{ s[0] }}{{ s[-1] }}", {"l": [10, 20, 30], "d": {"a": {"b": "deep"}}, "s": "héllo"}),
    ("with_block", "{% with a = 1, b = 'two' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", {}),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}", {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}),
    ("nested_loops_loop_var", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("unicode_ops", "{{ 'ÄÖÜ' | lower }} {{ 'straße' | upper }} {{ 'ǆ' | capitalize }} {{ '東京' ~ 'と' }} {{ '👍🏽' | length }} {{ 'αβγ'[1:] }}", {}),
    ("error_unsafe_append", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("error_undefined_attribute", "{{ missing.attr }}", {}),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("error_raise_exception", "{{ raise_exception('custom failure') }}", {}),
    ("error_int_div_zero", "{{ 1 // 0 }}", {}),
    ("error_unknown_filter", "{{ 'x' | no_such_filter }}", {}),
    ("error_extends", "{% extends 'base.html' %}", {}),
    ("error_unclosed_if", "{% if true %}never closed", {}),
]

# Random templates glued from fragments (seeded): whitespace control, loops, macros and filters
# interacting in ways no hand-written snippet covers.
RANDOM_FRAGMENTS = ["{% if x %}", "{% if not x %}", "{% else %}", "{% endif %}", "{% for i in l %}", "{% endfor %}", "{{ i }}", "{{ x }}",
         "{%- if x %}", "{% if x -%}", "{%- endif -%}", "{%+ if x %}", "{% endif +%}", "  ", "\n", "\n  ", "\t", "a", "b ",
         "{# c #}", "{#- c -#}", "{{- x -}}", "{{ l | join(',') }}", "{{ loop.index }}", "{% set y = 3 %}", "{{ y }}",
         " \n", "{{ s | trim }}", "{{ s.strip() }}", "{{ d | tojson }}", "{{ d }}", "{{ l[::-1] }}", "{{ s[1:] }}",
         "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", "{{ s ~ x }}", "{{ 'q' if x else 'r' }}", "{{ l | length }}",
         "{{ (l | first) + 1 }}", "{{ s.split(' ') }}", "{{ s | title }}", "{{ s | upper }}", "{{ 1.5 * 2 }}", "{{ 10 / 3 }}",
         "{%- for i in l -%}", "{% raw %}{{ r }}{% endraw %}", "{{ s.replace(' ', '_') }}", "{{ d.a }}", "{{ d.get('b', 7) }}",
 "{% macro m(a, b=2) %}[{{ a }}{{ b }}]{% endmacro %}", "{{ m(1) }}", "{{ m(b=5, a=0) }}", "{% set ns = namespace(n=0) %}",
 "{% set ns.n = ns.n + 1 %}", "{{ ns.n }}", "{% for i in l if i > 1 %}", "{% break %}", "{% continue %}", "{{ loop.last }}",
 "{{ l | map('string') | join('-') }}", "{{ d | dictsort }}", "{{ l | select('odd') | list }}", "{{ s | replace('l', 'L', 1) }}",
 "{{ s.split() }}", "{{ s.rstrip() }}", "{{ s.lstrip(' H') }}", "{{ 7 // 2 }}", "{{ -7 % 3 }}", "{{ s | wordcount }}",
 "{{ d | tojson(indent=2) }}", "{{ l | tojson(separators=(',', ':')) }}", "{{ 'x' is string }}", "{{ l is sequence }}",
 "{{ undefinedvar | default('dv') }}", "{{ undefinedvar is defined }}", "{% filter upper %}", "{% endfilter %}",
 "{% set blk %}", "{% endset %}{{ blk }}", "{{ s.startswith(' H') }}", "{{ s[::2] }}", "{{ l + [4] }}", "{{ (1, 2) }}",
 "{{ [1.0, 2e20, 1e-7] }}", "{{ {'k': none, 'b': true} }}", "{{ s | center(30) }}", "{{ s | indent(3, true) }}"]
RANDOM_CONTEXT = {"x": True, "l": [1, 2, 3], "s": " Hello wörld 你好 ", "d": {"a": [1, {"b": None}], "z": "é\n\"q\""}}


def random_snippets(n=250, seed=11):
    """n random templates that Jinja2 renders (the broken ones teach little)."""
    import random
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        source = "".join(rng.choice(RANDOM_FRAGMENTS) for _ in range(rng.randint(2, 10)))
        context = dict(RANDOM_CONTEXT, x=rng.random() < 0.5)
        if "expected" in render(source, context):
            out.append((f"random/{len(out)}", source, context))
    return out


def render(source, context):
    try:
        return {"expected": ENV.from_string(source).render(**context)}
    except Exception as e:  # the C++ renderer must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def chat_context(messages, options):
    ctx = {"messages": messages, "tools": options.get("tools"), "documents": None,
           "add_generation_prompt": options.get("add_generation_prompt", True)}
    ctx.update(SPECIAL)
    ctx.update(options.get("extra", {}))
    return ctx


def main():
    sources = {}
    for key, file in TEMPLATES.items():
        with open(os.path.join(CHAT, file), encoding="utf-8") as f:
            sources[key] = f.read()
    cases = []
    for template, convs in (("qwen3", CONVERSATIONS + QWEN3_ERRORS), ("qwen35_style", CONVERSATIONS + QWEN35_ONLY)):
        for name, messages, options in convs:
            case = {"name": f"{template}/{name}", "template": template, "messages": messages,
                    "tools": options.get("tools"), "add_generation_prompt": options.get("add_generation_prompt", True),
                    "extra": options.get("extra", {})}
            case.update(render(sources[template], chat_context(messages, options)))
            cases.append(case)
    snippets = []
    for name, source, context in SNIPPETS + random_snippets():
        snippet = {"name": name, "source": source, "context": context}
        snippet.update(render(source, context))
        snippets.append(snippet)
    out = {"generator": "tools/tokenizer/make_chat_cases.py", "jinja2": jinja2.__version__,
           "special_tokens": SPECIAL, "templates": TEMPLATES, "cases": cases, "snippets": snippets}
    path = os.path.join(CHAT, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases + snippets)
    print(f"{path}: {len(cases)} conversations, {len(snippets)} snippets ({n_err} expected errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
