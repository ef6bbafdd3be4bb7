"""Call formats: Hermes/Qwen JSON calls and the compact tag format."""

import json

import pytest

from rljax import tools
from rljax.tokenizers import _chat


def calculator_box():
  return tools.Toolbox(
    [tools.calculator_tool(), tools.calculator_tool(name="calc")]
  )


def test_hermes_parses_several_calls_and_malformed_ones():
  fmt = tools.HermesFormat()
  turn = (
    "Let me compute.\n<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "12*34"}}\n'
    "</tool_call>\n"
    '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}'
    "</tool_call>"
    '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>'
    '<tool_call>{"name": "g"}</tool_call>'
    "<tool_call>{'name': 'single quotes'}</tool_call>"
    '<tool_call>["a list"]</tool_call>'
    '<tool_call>{"arguments": {}}</tool_call>'
    '<tool_call>{"name": "h", "arguments": [1]}</tool_call>'
    '<tool_call>{"name": "calculator", "argu'
  )
  calls = fmt.parse(turn)
  assert [type(c).__name__ for c in calls] == [
    "ToolCall",
    "ToolCall",
    "ToolCall",
    "ToolCall",
    "ParseError",
    "ParseError",
    "ParseError",
    "ParseError",
    "ParseError",
  ]
  assert calls[0].name == "calculator"
  assert calls[0].arguments == {"expression": "12*34"}
  assert calls[0].text.startswith("<tool_call>") and calls[0].text.endswith(
    "</tool_call>"
  )
  assert calls[1] == tools.ToolCall("search", {"query": "x"}, calls[1].text)
  assert calls[2].arguments == {"a": 1}
  assert calls[3].arguments == {}
  assert "not valid JSON" in calls[4].error
  assert "must be a JSON object" in calls[5].error
  assert 'no "name"' in calls[6].error
  assert calls[7].name == "h" and '"arguments" of h must be' in calls[7].error
  assert "never closed" in calls[8].error
  assert fmt.parse("no calls here") == []
  assert fmt.stop_strings == ("</tool_call>",)


def test_hermes_results_render_as_text_and_messages():
  fmt = tools.HermesFormat()
  box = calculator_box()
  results = box.execute_all(
    fmt.parse(
      '<tool_call>{"name": "calculator", "arguments": {"expression": "2**10"}}'
      '</tool_call><tool_call>{"name": "nope"}</tool_call>'
    )
  )
  assert fmt.render(results) == (
    "<tool_response>\n1024\n</tool_response>\n"
    "<tool_response>\nError: unknown tool 'nope' (available: calculator,"
    " calc)\n</tool_response>"
  )
  assert fmt.messages(results) == [
    {"role": "tool", "name": "calculator", "content": "1024"},
    {
      "role": "tool",
      "name": "nope",
      "content": "Error: unknown tool 'nope' (available: calculator, calc)",
    },
  ]


def test_hermes_format_call_round_trips():
  fmt = tools.HermesFormat()
  call = tools.ToolCall("calculator", {"expression": '1 + "2" é'})
  text = fmt.format_call(call)
  assert text == (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression":'
    ' "1 + \\"2\\" é"}}\n</tool_call>'
  )
  assert fmt.parse(text) == [call._replace(text=text)]


# Qwen2.5's chat template, its tool parts: the tools in the system turn, an
# assistant turn's tool_calls, and tool results in a user turn.
QWEN25_TOOLS = """{%- if tools %}
{{- '<|im_start|>system\\n' + messages[0]['content'] }}
{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
{%- for tool in tools %}
{{- "\\n" }}{{- tool | tojson }}
{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- endif %}
{%- for message in messages[1:] %}
{%- if message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- for tool_call in message.tool_calls %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' + tool_call.function.arguments | tojson + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}"""


def test_hermes_matches_qwen25_template_rendering():
  fmt = tools.HermesFormat()
  box = calculator_box()
  call = tools.ToolCall("calculator", {"expression": "12*34"})
  result = box.execute(call)
  messages = [
    {"role": "system", "content": "Be exact."},
    {"role": "user", "content": "12*34?"},
    {
      "role": "assistant",
      "content": "",
      "tool_calls": [
        {"type": "function", "function": dict(call._asdict(), text=None)}
      ],
    },
    *fmt.messages([result]),
  ]
  rendered = _chat.render(
    QWEN25_TOOLS,
    messages,
    add_generation_prompt=False,
    special_tokens={},
    tools=box.schemas(),
  )
  system = rendered.split("<|im_end|>")[0]
  assert system == "<|im_start|>system\nBe exact.\n\n" + fmt.instructions(
    box.schemas()
  )
  assert "<|im_start|>assistant\n" + fmt.format_call(call) in rendered
  assert fmt.render([result]) in rendered
  for schema in box.schemas():
    assert json.dumps(schema, ensure_ascii=False) in rendered


def test_tag_format_parse_render_and_round_trip():
  fmt = tools.TagFormat({"calc": "calculator"}, result="={text}\n")
  box = calculator_box()
  turn = "a <calc> 12*34 </calc> b <calc>1/0</calc><b>not a call</b><calc>3+"
  calls = fmt.parse(turn)
  assert calls[:2] == [
    tools.ToolCall("calculator", "12*34", "<calc> 12*34 </calc>"),
    tools.ToolCall("calculator", "1/0", "<calc>1/0</calc>"),
  ]
  assert isinstance(calls[2], tools.ParseError)
  assert calls[2].name == "calculator" and "<calc> was never closed" in (
    calls[2].error
  )
  results = box.execute_all(calls)
  assert fmt.render(results) == (
    "=408\n=Error: division by zero\n"
    "=Error: the call opened with <calc> was never closed\n"
  )
  assert fmt.messages(results[:1]) == [
    {"role": "tool", "name": "calculator", "content": "=408\n"}
  ]
  assert fmt.stop_strings == ("</calc>",)
  call = tools.ToolCall("calculator", "2**8")
  assert fmt.format_call(call) == "<calc>2**8</calc>"
  assert fmt.parse(fmt.format_call(call)) == [
    call._replace(text="<calc>2**8</calc>")
  ]


def test_tag_format_default_result_and_several_tools():
  fmt = tools.TagFormat(["calc", "python"])
  assert fmt.stop_strings == ("</calc>", "</python>")
  calls = fmt.parse("<python>print(1)</python><calc>2*3</calc>")
  assert [(c.name, c.arguments) for c in calls] == [
    ("python", "print(1)"),
    ("calc", "2*3"),
  ]
  box = tools.Toolbox([tools.calculator_tool(name="calc")])
  assert fmt.render(box.execute_all(calls[1:])) == "<out>6</out>"
  assert "unknown tool 'python'" in box.execute(calls[0]).error


def test_format_configuration_errors():
  with pytest.raises(ValueError, match="sequence of names"):
    tools.TagFormat("calc")
  with pytest.raises(ValueError, match="non-empty names"):
    tools.TagFormat(["no spaces"])
  with pytest.raises(ValueError, match="must contain"):
    tools.TagFormat(["calc"], result="=")
  with pytest.raises(ValueError, match="format string"):
    tools.TagFormat(["calc"], result="{text}{other}")
  with pytest.raises(ValueError, match="call_tags"):
    tools.HermesFormat(call_tags=("<a>",))
  with pytest.raises(ValueError, match="one string argument"):
    tools.TagFormat(["calc"]).format_call(tools.ToolCall("calc", {"a": 1}))
  with pytest.raises(ValueError, match="arguments dict"):
    tools.HermesFormat().format_call(tools.ToolCall("calc", "1+1"))
  with pytest.raises(ValueError, match="as str"):
    tools.HermesFormat().parse(None)
