"""Sentence forms: which of a person's sentences the record keeps, decided by form, never by vocabulary.

A person's sentence enters the record unless its *form* says it carries nothing to
keep (README: How memory works).  ``sentence_form`` names the form of one sentence
(English or Chinese):

- ``question``: ends with ``?``/``？``, or (Chinese) ends with a question particle
  (``吗``, ``呢``, ``么``) or asks with an interrogative and ``啊``/``呀``;
- ``request``: asks the assistant for an answer ("explain …", "can you …", "tell me …",
  ``请…``, ``帮我…``, ``告诉我…``);
- ``greeting``: a short salutation without a statement of the speaker's own
  ("Hey Mel!", ``你好！``);
- ``thanks``: a short thank-you without a statement of the speaker's own;
- ``acknowledgement``: a short reply that only receives what was said ("OK.", "Got it",
  "That's really cool!", ``好的``, ``嗯嗯``);
- ``instruction``: about the current reply only ("just acknowledge", "one sentence please",
  ``用一句话回答``);
- ``statement``: everything else: what the record keeps, whatever its words.

The cues are *form words* (interrogatives, particles, salutations, reply verbs and
pronouns), never words of a topic: replacing a sentence's names, numbers, dates or nouns
by others never changes its form (tests/test_compaction_forms.py checks it on LoCoMo and
KdConv sentences).  A question that opens with a statement clause ("I moved to Berlin
last week, do you know a good cafe?") keeps that clause (``statement_clauses``).

``accepts_answer`` tells a sentence that accepts or points at something the assistant
said ("ok, let's use that name", "go with the second option", ``就用这个``): the record
then keeps the answer's sentence holding what was accepted beside it (``record``).
``corrects`` tells a sentence that changes something said before ("moved to",
"actually", ``改到``, ``更正``).
"""

from __future__ import annotations

import re

from app.memory.text import CJK_RE

STATEMENT = "statement"
QUESTION = "question"
REQUEST = "request"
GREETING = "greeting"
THANKS = "thanks"
ACKNOWLEDGEMENT = "acknowledgement"
INSTRUCTION = "instruction"
FORMS = (STATEMENT, QUESTION, REQUEST, GREETING, THANKS, ACKNOWLEDGEMENT, INSTRUCTION)

SHORT_WORDS = 6
"""A greeting, thanks or acknowledgement is at most this many words (longer sentences say more)."""
SHORT_CJK = 8
"""… or, in Chinese, at most this many characters (punctuation not counted)."""

_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*")
_FIRST_PERSON_RE = re.compile(
    r"\b(?:i|i'm|i’m|im|i've|i’ve|i'd|i’d|i'll|i’ll|my|me|mine|myself|we|we're|we’re|we've|we'll|our|ours|us)\b",
    re.I)
_ZH_FIRST_PERSON_RE = re.compile(r"我|咱")

# --- English -------------------------------------------------------------------------------------
_INTERJECTION = (r"(?:oh|ah|aw+|wow+|whoa|yay|woo+hoo+|woo+t?|hooray|yippee|haha|lol|hmm+|omg|ooh|ugh|yikes|gosh|oops|phew|hey|yo|"
                 r"ok|okay|k|sure|yes|yeah|yep|yup|no|nope|nah|right|alright|all right|fine|cool|great|"
                 r"nice|awesome|amazing|perfect|excellent|good|super|sweet|neat|lovely|brilliant|wonderful|"
                 r"fantastic|totally|absolutely|exactly|indeed|true|definitely|certainly|of course|agreed|agree|"
                 r"got it|gotcha|understood|noted|i see|makes sense|sounds good|sounds great|fair enough|"
                 r"no problem|no worries|congrats|congratulations|bravo|well done)")
_GREETING_RE = re.compile(r"^\W*(?:hi|hello|hey|hiya|howdy|yo|greetings|dear|(?:good )?(?:morning|afternoon|evening)|"
                          r"good (?:night|day)|long time no see|(?:nice|good|great) to (?:see|hear from|meet) you|"
                          r"bye|goodbye|see you|see ya|take care|talk (?:to you )?(?:soon|later)|cheers)\b", re.I)
_THANKS_RE = re.compile(r"^\W*(?:(?:oh|ok|okay|wow|great|awesome),? )?(?:thanks|thank you|thank u|thx|ty|"
                        r"many thanks|much appreciated|appreciate it|cheers)\b", re.I)
_ACK_RE = re.compile(rf"^\W*{_INTERJECTION}\b", re.I)
_LEADING_ACK_RE = re.compile(rf"^(?:\W*{_INTERJECTION}\b[\s,!.~…]*)+", re.I)
_VOCATIVE_RE = re.compile(r"^(?:[\s,!.~…]*\b[A-Z][a-z]+\b)+[\s,!.~…]*$")
_DEICTIC_EVAL_RE = re.compile(
    r"^\W*(?:that|this|that's|thats|this is|that is|that was|this was|that sounds|that looks|sounds|looks)"
    r"(?:\s+[A-Za-z'’-]+){0,3}\W*$", re.I)
_ASK_START_RE = re.compile(
    r"^\W*(?:what|what's|whats|why|how|how's|who|who's|whom|whose|where|where's|when|which|"
    r"is|are|am|was|were|do|does|did|can|could|would|will|shall|should|may|might|have|has|had|"
    r"isn't|aren't|don't|doesn't|didn't|won't|wouldn't|can't|couldn't|shouldn't|haven't|hasn't|"
    r"any|anything|anyone|ever)\b", re.I)
_REQUEST_RE = re.compile(
    r"^\W*(?:(?:please|pls|ok|okay|so|and|now|then|also)[, ]+)*"
    r"(?:(?:can|could|would|will) you (?:please |kindly )?|please |kindly |i'd like you to |i want you to |"
    r"i need you to )?"
    r"(?:explain|describe|tell me|tell us|give me|give us|show me|show us|list|summari[sz]e|translate|define|"
    r"suggest|recommend|compare|write|draft|outline|calculate|convert|generate|help me|help us|let me know|"
    r"walk me through|remind me (?:what|how|who|when|where|which|why)|find me|name)\b", re.I)
_POLITE_ASK_RE = re.compile(r"^\W*(?:(?:can|could|would|will) you|please)\b", re.I)
_REPLY_WORDS_RE = re.compile(
    r"\b(?:answer|answers|reply|replies|respond|response|acknowledge|sentence|sentences|word|words|brief|"
    r"briefly|short|shorter|concise|concisely|bullet|bullets|paragraph|summary|tl;?dr)\b", re.I)
_REPLY_ONLY_RE = re.compile(
    r"^\W*(?:(?:please|pls|ok|okay|so|and|now|then)[, ]+)*(?:just|only|simply|please|keep|answer|reply|respond|"
    r"be|in|one|two|three|a|no need|don't|do not|use|make|acknowledge|say)\b", re.I)

# --- Chinese -------------------------------------------------------------------------------------
_ZH_QUESTION_END_RE = re.compile(r"(?:吗|嘛|么)[\s。.!！~～…]*$")
_ZH_ASKS_RE = re.compile(r"(?:谁|什么|啥|怎么|怎样|怎么样|哪|几|多少|为什么|为啥|如何|是否|是不是|有没有|能不能|会不会|要不要)")
_ZH_ASK_END_RE = re.compile(r"(?:啊|呀|哇|呢)[\s。.!！~～…]*$")
_ZH_REQUEST_RE = re.compile(r"^\W*(?:请|麻烦|帮我|帮忙|给我|告诉我|跟我说|你(?:能|可以)|能不能|可不可以|可以帮|"
                            r"解释|介绍一下|推荐|说说|讲讲|列出|列举|翻译|总结|写一|描述)")
_ZH_GREETING_RE = re.compile(r"^\W*(?:你好|您好|大家好|嗨|哈喽|哈啰|嘿|早上好|上午好|下午好|晚上好|早安|晚安|早|再见|拜拜|回见)")
_ZH_THANKS_RE = re.compile(r"^\W*(?:谢谢|多谢|感谢|谢啦|谢了|辛苦了)")
_ZH_ACK_RE = re.compile(r"^(?:[\W\s]*(?:谢谢你?|多谢|感谢|好的|好吧|好啊|好呀|好|嗯+|哦+|噢|喔|啊|对的|对啊|对|是的|是啊|是|明白了?|了解了?|知道了|"
                        r"收到|行|可以|没问题|哈+|原来如此|这样啊|不错|太好了|太棒了|厉害|真好|真棒|有道理|确实|当然|"
                        r"没错|好厉害|真的|这样)(?:啊|呀|吧|哈|的|呢|了|哦|你|您)*)+[\W\s]*$")
_ZH_REPLY_RE = re.compile(r"(?:一句话|两句话|简短|简单(?:地)?(?:回答|说|回复)|只(?:需|要)?(?:回答|回复|说)|不用解释|"
                          r"不要解释|回答.{0,4}就行|回复.{0,4}就行|确认一下就行|说是或否)")

# --- accepting an answer, correcting -------------------------------------------------------------
_ORDINAL_EN = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4,
               "fifth": 5, "5th": 5, "last": -1, "latter": -1, "former": 1}
_ZH_NUMERALS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_ACCEPT_EN_RE = re.compile(
    r"\b(?:let'?s|let us|we'?ll|we will|i'?ll|i will|i'd|we'd|go|going|i'm going|we're going|gonna|i want|we want)"
    r" (?:go with|use|take|pick|choose|try|do|stick with|keep|call it|name it|adopt|run with|book|order)\b"
    r"|\b(?:go with|use|take|pick|choose|stick with) (?:that|this|it|those|these|yours|your|the (?:first|second|"
    r"third|fourth|fifth|last|latter|former|one|same)|option|number|#)\b"
    r"|^\W*(?:(?:ok|okay|yes|yeah|great|perfect|sure|alright|good|fine)\W+)*"
    r"(?:that|this|it|the (?:first|second|third|fourth|fifth|last|latter|former)(?: one| option)?)"
    r" (?:one )?(?:sounds|works|is perfect|is great|is good|looks good|it is|will do|is it|wins)\b"
    r"|\b(?:i|we) (?:like|love|prefer|agree with|accept|approve) (?:that|this|it|those|these|your|the (?:first|"
    r"second|third|fourth|fifth|last|latter|former|name|idea|plan|option|suggestion))\b", re.I)
_ACCEPT_ZH_RE = re.compile(r"就用|就选|就定|就按|就这个|就这样|就它|用这个|用那个|选这个|选那个|选第|用第|第[一二两三四五六七八九十\d]+个|"
                           r"那就|听你的|按你说的|照你说的|同意|就叫|就是它")
_CORRECTION_EN_RE = re.compile(
    r"\b(?:actually|correction|to correct|i meant|i mean|sorry,? (?:i|it|that|the)|scratch that|"
    r"not .{1,40}? but|instead|rather than|changed? to|moved? to|moving to|switched? to|pushed (?:back )?to|"
    r"postponed to|rescheduled|brought forward|no longer|any ?more|update:|now it'?s|it'?s now|is now|are now)\b",
    re.I)
_CORRECTION_ZH_RE = re.compile(r"改到|改成|改为|改在|改用|更正|纠正|其实|不是.{1,20}?而是|换成|换到|推迟到|延后到|提前到|"
                               r"挪到|变成|不再|现在是|说错了|搞错了")


def _plain_len(sentence: str) -> int:
    """Words (Latin) or characters (Chinese) of ``sentence``, punctuation not counted."""
    if CJK_RE.search(sentence):
        return len(CJK_RE.findall(sentence)) + len(_WORD_RE.findall(CJK_RE.sub(" ", sentence)))
    return len(_WORD_RE.findall(sentence))


def _short(sentence: str) -> bool:
    return _plain_len(sentence) <= (SHORT_CJK if CJK_RE.search(sentence) else SHORT_WORDS)


def _first_person(sentence: str) -> bool:
    return bool(_FIRST_PERSON_RE.search(sentence) or _ZH_FIRST_PERSON_RE.search(sentence))


def is_question(sentence: str) -> bool:
    """True when ``sentence`` asks (``?``/``？``; Chinese question particles or an interrogative with ``啊``)."""
    text = sentence.rstrip()
    if text.endswith(("?", "？")):
        return True
    if CJK_RE.search(text):
        return bool(_ZH_QUESTION_END_RE.search(text) or (_ZH_ASKS_RE.search(text) and _ZH_ASK_END_RE.search(text)))
    return False


def sentence_form(sentence: str) -> str:
    """The form of one sentence: one of ``FORMS`` (see the module docstring).

    Args:
        sentence: one sentence (``record.sentences`` splits a message), English or Chinese.

    Returns:
        ``statement`` unless the form says the sentence carries nothing to keep.
    """
    text = sentence.strip()
    if not text or not re.search(r"\w", text):
        return ACKNOWLEDGEMENT
    if accepts_answer(text):
        return STATEMENT  # it points at what was told: kept, with the answer's sentence (record.told_line)
    if is_question(text):
        return QUESTION
    cjk = bool(CJK_RE.search(text))
    if cjk:
        if _ZH_REQUEST_RE.search(text):
            return REQUEST
        if _ZH_REPLY_RE.search(text) and _plain_len(text) <= 16 and not _first_person(text.replace("给我", "")):
            return INSTRUCTION
        if _short(text) and not _first_person(text):
            if _ZH_THANKS_RE.search(text):
                return THANKS
            if _ZH_GREETING_RE.search(text):
                return GREETING
            if _ZH_ACK_RE.search(text):
                return ACKNOWLEDGEMENT
        return STATEMENT
    if _REQUEST_RE.search(text):
        return REQUEST
    if _POLITE_ASK_RE.search(text) and _REPLY_WORDS_RE.search(text) is None and not _first_person(text):
        return REQUEST  # "Could you go through the steps again."
    if _REPLY_WORDS_RE.search(text) and _REPLY_ONLY_RE.search(text) and _plain_len(text) <= 10 \
            and not _FIRST_PERSON_RE.search(re.sub(r"\b(?:give|tell|show) me\b", "", text, flags=re.I)):
        return INSTRUCTION
    if _short(text) and not _first_person(text):
        if _THANKS_RE.search(text):
            return THANKS
        if _GREETING_RE.search(text):
            return GREETING
        if _acknowledges(text):
            return ACKNOWLEDGEMENT
    return STATEMENT


def _acknowledges(text: str) -> bool:
    """Interjections ("OK", "Wow", "Got it"), then nothing but a name ("Yeah, Gina!") or an evaluation of what
    was said ("That's really cool."); never a sentence that goes on to say something ("No, the meeting is
    on Tuesday")."""
    rest = _LEADING_ACK_RE.sub("", text, count=1)
    if rest != text and (not re.search(r"\w", rest) or _VOCATIVE_RE.match(rest)):
        return True
    return bool(_DEICTIC_EVAL_RE.match(rest))


def carries_nothing(sentence: str) -> bool:
    """True when the form of ``sentence`` says it carries nothing to keep (anything but a statement)."""
    return sentence_form(sentence) != STATEMENT


_CLAUSE_RE = re.compile(r"(?<=[,;，；])\s*|\s+[-–—]\s+")


def statement_clauses(sentence: str) -> list[str]:
    """The clauses of a question or request that are statements of their own, in order.

    "I moved to Berlin last week, do you know a good cafe?" gives ``["I moved to Berlin last week"]``;
    a clause that asks, greets or acknowledges gives nothing, and the clauses after the first one that
    asks belong to its question ("Could you plan a trip, with some ideas about where to go?" gives
    ``[]``); the last clause (the one that asks) never counts.  ``[]`` for a sentence of one clause.
    """
    clauses = [c.strip() for c in _CLAUSE_RE.split(sentence.strip()) if c and c.strip()]
    if len(clauses) < 2:
        return []
    kept = []
    for clause in clauses[:-1]:
        bare = clause.rstrip(",;，；").strip()
        if _ASK_START_RE.search(bare) or (CJK_RE.search(bare) and (_ZH_ASKS_RE.search(bare) or is_question(bare))):
            break  # what follows continues this question
        if sentence_form(bare) == STATEMENT and _plain_len(bare) >= 3:
            kept.append(bare)
    return kept


def accepts_answer(sentence: str) -> bool:
    """True when ``sentence`` accepts or points at something the assistant said (English or Chinese)."""
    return bool(_ACCEPT_EN_RE.search(sentence) or _ACCEPT_ZH_RE.search(sentence)) and not sentence.rstrip().endswith(
        ("?", "？"))


def ordinal_reference(sentence: str) -> int | None:
    """The item a sentence points at ("the second option": 2, "the last one": -1, ``第三个``: 3), or None."""
    match = re.search(r"\b(first|1st|second|2nd|third|3rd|fourth|4th|fifth|5th|last|latter|former)\b", sentence, re.I)
    if match:
        return _ORDINAL_EN[match.group(1).lower()]
    match = re.search(r"\b(?:option|number|#) ?(\d)\b", sentence, re.I)
    if match:
        return int(match.group(1))
    match = re.search(r"第([一二两三四五六七八九十]|\d+)", sentence)
    if match:
        value = match.group(1)
        return int(value) if value.isdigit() else _ZH_NUMERALS[value]
    if re.search(r"最后一个", sentence):
        return -1
    return None


_ORDINAL_WORDS = {1: r"first|1st|第一", 2: r"second|2nd|第二", 3: r"third|3rd|第三", 4: r"fourth|4th|第四",
                  5: r"fifth|5th|第五", -1: r"last|最后"}


def names_ordinal(text: str, ordinal: int) -> bool:
    """True when ``text`` itself names the ``ordinal``-th item ("The second option is …", ``第二个是…``)."""
    words = _ORDINAL_WORDS.get(ordinal)
    return bool(words and re.search(rf"(?:\b(?:{words})\b|{words})", text, re.I))


def corrects(sentence: str) -> bool:
    """True when ``sentence`` changes something said before ("moved to", "actually", ``改到``, ``更正``)."""
    return bool(_CORRECTION_EN_RE.search(sentence) or _CORRECTION_ZH_RE.search(sentence))
