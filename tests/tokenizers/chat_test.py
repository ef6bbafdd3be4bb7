"""Chat templates render exactly as transformers renders them."""

import jinja2
import pytest

from rljax.tokenizers import _chat

SMOLLM2 = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] !="
  " 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named"
  " SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
  " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
  "{% endif %}"
)

# Llama-3 style: bos_token, a system message pulled out, namespace, trim,
# raise_exception on a bad role, whitespace control with trim/lstrip blocks.
LLAMA3_LIKE = """{{- bos_token }}
{%- set ns = namespace(system='You are helpful.', n=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
<|start_header_id|>system<|end_header_id|>

{{ ns.system }}<|eot_id|>
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {%- set ns.n = ns.n + 1 %}
    <|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""

# Qwen style: tools through tojson (non-ASCII, HTML characters), loop
# controls, dict(), reasoning aliases, a {% generation %} block.
QWEN_LIKE = """{%- if tools %}
<|im_start|>system
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
  {%- if message.role == 'skip' %}{% continue %}{% endif %}
  {%- if message.role == 'stop' %}{% break %}{% endif %}
  {%- set extra = dict(n=loop.index) %}
<|im_start|>{{ message.role }}{{ extra.n }}
{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}
{%- if message.role == 'assistant' %}{% generation %}{{ message.content }}{% endgeneration %}{% else %}{{ message.content }}{% endif %}<|im_end|>
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{%- if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}
{% endif %}"""

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}
CHATS = [
  [{"role": "user", "content": "What is 2+3?"}],
  [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": " Hi <b>é</b> "},
    {"role": "assistant", "content": "Hello!", "thinking": "greet"},
    {"role": "user", "content": "2+2?"},
  ],
  [
    {"role": "skip", "content": "x"},
    {"role": "user", "content": "a"},
    {"role": "stop", "content": "y"},
    {"role": "user", "content": "never"},
  ],
]
TOOLS = [{"name": "add", "description": "Adds <a> & <b> → ünïcode"}]


def _transformers_render(template, chat, add_generation_prompt, **kwargs):
  utils = pytest.importorskip("transformers.utils.chat_template_utils")
  rendered, _ = utils.render_jinja_template(
    conversations=[chat],
    chat_template=template,
    add_generation_prompt=add_generation_prompt,
    **{**SPECIAL, **kwargs},
  )
  return rendered[0]


@pytest.mark.parametrize("template", [SMOLLM2, LLAMA3_LIKE, QWEN_LIKE])
@pytest.mark.parametrize("chat_index", [0, 1, 2])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers(template, chat_index, add_generation_prompt):
  chat = CHATS[chat_index]
  if template is LLAMA3_LIKE and chat_index == 2:
    chat = chat[1:2]  # the other roles raise (tested below)
  kwargs = {"tools": TOOLS} if template is QWEN_LIKE else {}
  ours = _chat.render(
    template,
    chat,
    add_generation_prompt=add_generation_prompt,
    special_tokens=SPECIAL,
    **kwargs,
  )
  assert ours == _transformers_render(
    template, chat, add_generation_prompt, **kwargs
  )


def test_template_kwargs_match_transformers():
  chat = CHATS[0]
  ours = _chat.render(
    QWEN_LIKE,
    chat,
    add_generation_prompt=True,
    special_tokens=SPECIAL,
    enable_thinking=False,
  )
  # "{%-" eats the newlines before each tag and trim_blocks the one after
  # "{% endif %}", so the turns run together.
  assert ours == (
    "<|im_start|>user1\nWhat is 2+3?<|im_end|><|im_start|>assistant"
    "<think></think>"
  )
  assert ours == _transformers_render(
    QWEN_LIKE, chat, True, enable_thinking=False
  )


def test_smollm2_by_hand():
  rendered = _chat.render(
    SMOLLM2, CHATS[0], add_generation_prompt=True, special_tokens=SPECIAL
  )
  assert rendered == (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained"
    " by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
    "<|im_start|>assistant\n"
  )


def test_trim_and_lstrip_blocks_by_hand():
  # lstrip_blocks drops the indentation before a block tag and trim_blocks
  # the newline after it, so only "A\n" and "B" remain.
  template = "  {% if true %}\nA\n  {% endif %}\nB"
  assert (
    _chat.render(template, [], add_generation_prompt=False, special_tokens={})
    == "A\nB"
  )


def test_tojson_keeps_html_and_unicode():
  out = _chat.render(
    "{{ x | tojson }}",
    [],
    add_generation_prompt=False,
    special_tokens={},
    x="<é>",
  )
  assert out == '"<é>"'  # jinja's own tojson would write "\\u003c\\u00e9..."


def test_raise_exception_propagates():
  with pytest.raises(jinja2.TemplateError, match="Unknown role: tool"):
    _chat.render(
      LLAMA3_LIKE,
      [{"role": "tool", "content": "x"}],
      add_generation_prompt=True,
      special_tokens=SPECIAL,
    )


def test_sandboxed():
  with pytest.raises(jinja2.exceptions.SecurityError):
    _chat.render(
      "{{ ''.__class__.__mro__ }}",
      [],
      add_generation_prompt=False,
      special_tokens={},
    )
  with pytest.raises(jinja2.exceptions.SecurityError, match="underscore"):
    _chat.render(
      "{% set ns = namespace(_x=1) %}",
      [],
      add_generation_prompt=False,
      special_tokens={},
    )


def test_bad_messages():
  with pytest.raises(ValueError, match=r"messages\[1\] must be a dict"):
    _chat.render(
      SMOLLM2,
      [{"role": "user", "content": "a"}, "oops"],
      add_generation_prompt=True,
      special_tokens={},
    )
  with pytest.raises(ValueError, match="messages must be a list of dicts"):
    _chat.render(
      SMOLLM2,
      {"role": "user", "content": "a"},
      add_generation_prompt=True,
      special_tokens={},
    )


def test_messages_are_not_modified():
  chat = [{"role": "assistant", "content": "x", "thinking": "t"}]
  _chat.render(QWEN_LIKE, chat, add_generation_prompt=False, special_tokens={})
  assert chat == [{"role": "assistant", "content": "x", "thinking": "t"}]
