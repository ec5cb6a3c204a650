"""The fact guard: the names, numbers, dates, identifiers and decisions a compaction must keep.

``extract_facts`` reads English and Chinese.  Latin-script facts come from
regular expressions (URLs, e-mail addresses, ISO/written/numeric dates, clock
times, backticked code, identifiers such as ``INC-4471`` or ``eu-west-2``,
code names, acronyms, numbers with their unit, capitalized names).  Chinese
facts come from regular expressions for dates, times and numbers with units or
counters (``2025年3月14日``, ``4月2日``, ``9点20分``, ``9000欧元``, ``3个副本``,
``两万元``) and from jieba's part-of-speech tags for person, place and
organization names (``nr``, ``ns``, ``nt``; the dictionary loads on first use,
about a second).  Identifiers written next to Chinese characters
(``工单号是INC-4471``) are found because word boundaries are ASCII-only.

``states_decision`` tells a sentence that decides, rules out or prefers
something ("we decided to ...", "决定…", "不做…", "I prefer ...").

Other scripts (Cyrillic, Arabic, Devanagari, ...) are not read beyond their
digits and Latin identifiers: ``unread_share`` says how much of a text that is,
so a retention figure never claims to have checked what it could not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from app.memory import segment
from app.memory.cache import ByteCache, text_bytes
from app.memory.text import CJK, CJK_RE, FENCED_CODE_RE

# ------------------------------------------------------------------------------------------ scripts

_CJK_RUN_RE = re.compile(f"[{CJK}0-9０-９A-Za-z%％.·]+")

# ASCII-only boundaries: a Chinese character next to an identifier is a boundary.
_A = r"(?<![A-Za-z0-9])"
_Z = r"(?![A-Za-z0-9])"

# ------------------------------------------------------------------------------------------ Latin

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_UNIT_STOPWORDS = frozenset("""
a an the and or but of to in on at by for from with as is are was were be been am it its this that these those
than then so if not no nor per via into onto over under about after before since until times more less most
least only just also too very much many few some any all each every other another same such what which who
instead ago later earlier again yet already still now here there together apiece total overall left ahead
or and plus minus
""".split())
_UPPER_UNITS = frozenset("GB MB TB KB PB GiB MiB TiB KiB Hz kHz MHz GHz kW MW USD EUR GBP CNY RMB JPY CHF".split())
_LATIN_PATTERNS = [
    re.compile(_A + r"https?://[^\s<>\"'`\u3000-\u303f\uff00-\uffef" + CJK + r"]+"),   # URLs
    re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+" + _Z, re.A),             # e-mail addresses
    re.compile(_A + r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:Z|[+-]\d{2}:?\d{2})?)?" + _Z),
    re.compile(_A + rf"{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?" + _Z),   # March 15, 2024
    re.compile(_A + rf"\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}\.?(?:,? \d{{4}})?" + _Z),  # 15 March 2024
    re.compile(_A + rf"{_MONTH} \d{{4}}" + _Z),                                       # March 2025
    re.compile(_A + r"\d{1,2}/\d{1,2}/\d{2,4}" + _Z),                                 # 3/15/2024
    re.compile(_A + r"\d{1,2}:\d{2}(?:\s?[AaPp]\.?[Mm]\.?)?(?: UTC| GMT| CET| [A-Z]{3}T)?" + _Z),  # 09:20 UTC
    re.compile(r"`([^`\n]{1,80})`"),                                                  # `code names`
    # identifiers mixing letters and digits with separators: INC-4471, eu-west-2, v2.3.1, QV-58213
    re.compile(r"(?<![A-Za-z0-9@/.-])(?=[\w#./:-]{0,64}\d)(?=[\w#./:-]{0,64}[A-Za-z])[A-Za-z0-9]+(?:[-_./:#][A-Za-z0-9]+)+"
               + _Z, re.A),
    re.compile(_A + r"[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+" + _Z),                       # snake_case
    re.compile(_A + r"[a-z]+[A-Z][A-Za-z0-9]*" + _Z),                                 # camelCase
    re.compile(_A + r"[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*" + _Z),                         # PascalCase, GitHub
    re.compile(_A + r"[A-Z]{2,}[0-9]*" + _Z),                                         # AWS, S3 (acronyms)
    re.compile(_A + r"(?=[A-Za-z]*\d)[A-Za-z]+\d[A-Za-z0-9]*" + _Z),                  # H100, gpt4
]
# A number and its unit or counted noun: 68 kg, 3 replicas, 9000 euros, $300, 12,000 requests, 40%.
_NUMBER = r"[$€£¥]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[$€£¥]?\d+(?:\.\d+)?"
_NUMBER_UNIT_RE = re.compile(rf"(?<![\w.,$€£¥-])({_NUMBER})(%|(?: ?)([A-Za-z][A-Za-z]*)\b)?", re.A)
_EXCLUDED_TOKENS = frozenset({"OK", "AM", "PM", "I", "TV", "ID", "UTC", "GMT"})
_ORDINAL_RE = re.compile(r"^\d+(?:st|nd|rd|th)$")
_TRAILING = ".,;:!?)]}'\"’”。，；：！？）】」"

_NAME_WORD = r"[A-Z](?:[a-z]+|(?=['’][A-Z]))(?:['’-][A-Za-z]+)*"
_NAME_RE = re.compile(rf"(?<![A-Za-z0-9]){_NAME_WORD}(?: (?:{_NAME_WORD}|[A-Z]\.))*(?![A-Za-z0-9])")
_NOT_NAMES = frozenset("""
i i'm i've i'd i'll a an and but or so if when what why how who whom whose where which this that these those
it it's its we you he she they my our your their his her me us them hi hello hey dear thanks thank yes no not ok
okay sure please great good fine well also then now let let's can could would should will shall may might must do
does did done is are was were be been being have has had just maybe perhaps here there sorry oh ah wow nice cool
right got noted understood absolutely of in on at for with to from by as after before since until about into over
under today tonight tomorrow yesterday monday tuesday wednesday thursday friday saturday sunday january february
march april june july august september october november december user assistant person summary key facts earlier
note notes anyway however although because while during besides first second third next last finally sounds glad
happy enjoy nope yep yeah exactly true false indeed certainly definitely every each some any all both either
neither one two three turns turn record conversation ask call tell send set use check ping meet see add make get
give show run try keep find visit read write email contact talk remind book buy pay move ship
""".split())

# ------------------------------------------------------------------------------------------ Chinese

_ZH_DIGIT = "零〇一二两三四五六七八九十百千万亿"
# A number starts where its run of digits starts (the same matches as from inside the run, read once).
_ZH_NUM = rf"(?:(?<!\d)\d+(?:\.\d+)?|(?<![{_ZH_DIGIT}])[{_ZH_DIGIT}]+)"
_ZH_UNITS = ("欧元|美元|英镑|日元|人民币|万元|亿元|千元|元|块钱|块|分钱|"
             "公里|千米|米|厘米|毫米|公斤|千克|克|斤|吨|升|毫升|"
             "GB|MB|TB|KB|G|M|T|ms|"
             "小时|分钟|秒钟|秒|天|周|个月|月|年|岁|"
             "个|台|位|名|人|次|份|套|张|条|本|件|间|层|号线|号楼|号|倍|项|家|辆|颗|核|"
             "%|％|度")
_ZH_PATTERNS = [
    re.compile(rf"(?:\d{{4}}|[{_ZH_DIGIT}]{{4}})年(?:\d{{1,2}}|[{_ZH_DIGIT}]{{1,3}})月"
               rf"(?:(?:\d{{1,2}}|[{_ZH_DIGIT}]{{1,3}})[日号])?"),                     # 2025年3月14日, 2025年3月
    re.compile(rf"(?<![\d年])(?:\d{{1,2}}|[{_ZH_DIGIT}]{{1,3}})月(?:\d{{1,2}}|[{_ZH_DIGIT}]{{1,3}})[日号]"),  # 4月2日
    re.compile(r"(?:上|下|这|本)?(?:周|星期|礼拜)[一二三四五六日天]"),                  # 下周三, 星期五
    re.compile(rf"(?:凌晨|早上|上午|中午|下午|晚上)?(?:\d{{1,2}}|[{_ZH_DIGIT}]{{1,3}})[点时]"
               rf"(?:(?:\d{{1,2}}|[{_ZH_DIGIT}]{{1,3}})分|半|整)?"),                   # 9点20分, 下午三点
    re.compile(rf"(?:百分之[{_ZH_DIGIT}]+)"),                                            # 百分之五十
    re.compile(rf"{_ZH_NUM}(?:{_ZH_UNITS})"),                                         # 9000欧元, 68公斤
    re.compile(rf"{_ZH_NUM}(?:个|台|位|名|件|套|张|条|本|间|辆|颗|只|家)[{CJK}]{{1,3}}?"
               rf"(?=[，。；、！？,.;:：\s]|$)"),                                       # 3个副本, 两台服务器
]
_ZH_PERSON_FLAGS = frozenset({"nr", "nrfg", "nrt"})
_ZH_PLACE_FLAGS = frozenset({"ns", "nt"})
# jieba's dictionary tags some common nouns as person names (索引 "index" is ``nr``): a person's name is
# kept when it starts with one of the common surnames (about 95 % of people in China carry one of these).
_ZH_SURNAMES = frozenset(
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢姜崔钟"
    "谭陆汪范金石廖贾夏韦付傅方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵钱严覃武戴莫孔汤温康施牛樊葛邢齐乔伍"
    "庞颜倪庄聂章鲁岳翟殷詹申欧耿兰焦俞左柳甘祝包尚舒阮柯纪梅童凌毕季裴霍涂苗谷盛翁冉骆蓝游辛靳管柴蒙鲍华喻祁蒲"
    "房滕屈饶艾尤穆卓古吉缪简车项连麦褚娄窦戚岑景党宫费卜冷晏席卫米柏宗瞿桂佟臧闵苟邬卞姬师仇栾隋商刁沙荣巫寇桑"
    "郎甄丛仲虞敖巩佘池查麻苑迟邝")
_ZH_TOP_SURNAMES = frozenset("王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹")
"""The thirty most common surnames: a two-character name in jieba's dictionary counts when it starts with one."""
_ZH_COMPOUND_SURNAMES = ("欧阳", "司马", "上官", "诸葛", "东方", "皇甫", "慕容", "令狐", "夏侯", "尉迟", "长孙", "宇文")
# Common words that jieba's dictionary tags as person, place or organization names (``中断`` "interrupt"
# is ``ns``, ``谢谢`` "thanks" is ``nr``): never facts.  Found by reading the most frequent such entries.
_ZH_NOT_NAMES = frozenset("""
负责人 数据库 服务器 工单号 上线 用户 助手 时间 今天 明天 中文 英文 中国人 大家 朋友 老师 同学 谢谢 中断 欧阳
东西 江湖 城市 平原 外国 爱国 南北 东北 西北 西南 东南 英雄 朝廷 太阳 哥哥 海洋 湖泊 大桥 高原 上市 建国 美丽 山区
大街 王国 开国 共和国 城镇 国家机关 人民政府 人民法院 自治州 自治县 阿哥 庆典 深度 山脉 回国 大国 治安 新鲜 古城
海峡 冰川 长度 山水 长大 莫非 普及 商城 古典 阴阳 江山 高山 大海 山坡 河谷 上马 太平 福利 日志 云集 青春 山河 神圣
新建 河水 山洞 都城 关联 海湾 上半场 湖水 广义 大圣 上山 兴国 新港 新城 海关 舞美 大洋 山峰 内城 石桥 中密度 朝阳
下山 上台 山寨 西洋 契约 二哥 白马 入口 入市 武功 王朝 陆军 卫星 雷达 荣誉 古老 冷笑 武林 宫殿 胡同 师傅 师兄 顾问
王爷 王公 白雪 高峰 齐声 石英 金殿 师哥 高潮 齐全 黄金周 顾客 辛勤 米粉 古建筑 胡子 王府 叶子 白领 康复 沙滩 师范
梅花 吉祥 范畴 周转 孙子 杜鹃花
""".split())
# ------------------------------------------------------------------------------------------ decisions

_DECISION_EN = re.compile(
    r"\b(?:decided|decide|decision|we(?:'ll| will) (?:go with|use|keep|ship|move|switch|stick)|let'?s (?:go with|use|"
    r"keep|stick)|going with|go with|agreed|settled on|chose|choose|picked|prefer|preference|rather|i like|i love|"
    r"i hate|i don'?t (?:want|like)|don'?t (?:use|do|want)|do not|won'?t|will not|never|always|must|no longer|"
    r"ruled out|rule out|instead of|not going to|remember that|from now on|postpone|postponed|cancel|cancelled|"
    r"deadline|budget)\b", re.I)
_DECISION_ZH = re.compile(r"决定|决策|定了|确定|不做|不用|不要|不再|别用|改为|改成|改用|推迟|延后|提前|取消|选择|选用|就用|"
                          r"采用|必须|一定要|务必|记住|以后都|预算|截止|优先|"
                          r"(?:我|我们)(?:更|最|比较|很|也|一直)?(?:喜欢|偏好|倾向|希望|想要)")  # the person's own preference


def states_decision(text: str) -> bool:
    """True when ``text`` decides, rules out, prefers or commits to something (English or Chinese cues)."""
    return bool(_DECISION_EN.search(text) or _DECISION_ZH.search(text))


# ------------------------------------------------------------------------------------------ extraction


def _is_sentence_start(text: str, index: int) -> bool:
    """True when only spaces, quotes and brackets stand between ``index`` and the text's start or a sentence
    end (reads back over those characters only: linear over all the names of a text)."""
    at = index
    while at > 0 and text[at - 1] in _OPENERS:
        at -= 1
    return at == 0 or text[at - 1] in ".!?\n:。！？：…"


_OPENERS = frozenset(" \t\"'“‘([*-")


def _names(text: str) -> list[tuple[int, str]]:
    """Capitalized word runs that are not stop words and do not merely open a sentence."""
    found = []
    for match in _NAME_RE.finditer(text):
        position = match.start()
        run: list[str] = []
        run_start = position
        for word in match.group(0).split(" ") + [""]:
            if word and word.lower().rstrip(".") not in _NOT_NAMES:
                if not run:
                    run_start = position
                run.append(word)
            elif run:
                while run and re.fullmatch(r"[A-Z]\.", run[-1]):  # a trailing initial is no name
                    run.pop()
                if run and (len(run) > 1 or not _is_sentence_start(text, run_start)):
                    found.append((run_start, " ".join(run)))
                run = []
            position += len(word) + 1
    return found


def _latin(text: str) -> list[tuple[int, str]]:
    spans: list[tuple[int, str]] = []
    for pattern in _LATIN_PATTERNS:
        for match in pattern.finditer(text):
            value = match.group(1) if match.groups() else match.group(0)
            value = value if value.endswith("%") else value.rstrip(_TRAILING)
            if not value or value in _EXCLUDED_TOKENS or _ORDINAL_RE.match(value):
                continue
            spans.append((match.start(), value))
    for match in _NUMBER_UNIT_RE.finditer(text):
        number, suffix, word = match.group(1), match.group(2), match.group(3)
        if suffix == "%":
            spans.append((match.start(), number + "%"))
        elif word and (word in _UPPER_UNITS or (word[1:].islower() or len(word) == 1)) and \
                word.lower() not in _UNIT_STOPWORDS and (len(word) > 1 or word in "kgmsbKGMB"):
            spans.append((match.start(), text[match.start():match.end()].rstrip(_TRAILING)))
        elif re.search(r"[$€£¥.,]|\d\d", number):  # a bare number: two digits or more, or money, or decimals
            spans.append((match.start(), number))
    spans.extend(_names(text))
    return spans


def _chinese(text: str) -> list[tuple[int, str]]:
    spans: list[tuple[int, str]] = []
    for pattern in _ZH_PATTERNS:
        for match in pattern.finditer(text):
            value = match.group(0).rstrip(_TRAILING)
            if re.fullmatch(r"[一二两三四五六七八九十]个(?:月|人)?", value) and "个月" not in value:
                continue  # 一个, 两个: counting words, not facts
            spans.append((match.start(), value))
    posseg = segment.tagger()
    dictionary = posseg.dt.word_tag_tab
    for run in re.finditer(r"\S+", text):  # each run of non-space characters that holds a Chinese character
        if not CJK_RE.search(run.group(0)):
            continue
        offset = run.start()
        pairs = [(p.word, p.flag) for p in posseg.cut(run.group(0))]
        merged: list[tuple[str, str]] = []
        for word, flag in pairs:  # 欧阳 + 娜娜: a compound surname and the given name jieba split off
            if merged and merged[-1][0] in _ZH_COMPOUND_SURNAMES and flag in _ZH_PERSON_FLAGS:
                merged[-1] = (merged[-1][0] + word, "nr")
            else:
                merged.append((word, flag))
        for word, flag in merged:
            if len(word) >= 2 and word not in _ZH_NOT_NAMES and CJK_RE.match(word) and (
                    flag in _ZH_PLACE_FLAGS or (flag in _ZH_PERSON_FLAGS and _chinese_person_name(word) and (
                        len(word) >= 3 or word not in dictionary or word[0] in _ZH_TOP_SURNAMES))):
                spans.append((offset, word))
            offset += len(word)
    return spans


def _chinese_person_name(word: str) -> bool:
    """True for 2-4 characters starting with a common surname (single or compound).

    Two-character words that jieba's dictionary itself tags as names are mostly common
    nouns (``武功``, ``王朝``): the caller keeps only names jieba found in the text
    (not in its dictionary) or of three characters and more.
    """
    if word.startswith(_ZH_COMPOUND_SURNAMES):
        return 3 <= len(word) <= 4
    return word[0] in _ZH_SURNAMES and 2 <= len(word) <= 3


MAX_FACTS = 200
"""CPU budget: the most facts read from one text (the first ones; a real message holds a few dozen at most)."""
CACHE_MAX_BYTES = 8 * 1024 * 1024
"""The process's cache of facts per text is bounded to this many bytes (texts and facts; least recently used
out); a text larger than ``CACHE_ENTRY_MAX_BYTES`` is read without being kept."""
CACHE_ENTRY_MAX_BYTES = 64 * 1024
_cache: ByteCache[tuple[str, ...]] = ByteCache(CACHE_MAX_BYTES, CACHE_ENTRY_MAX_BYTES)


def _extract(text: str) -> tuple[str, ...]:
    found = _cache.get(text)
    if found is None:
        found = _read_facts(text)
        _cache.put(text, found, text_bytes(text) + sum(text_bytes(f) + 8 for f in found) + 200)
    return found


def _read_facts(text: str) -> tuple[str, ...]:
    plain = FENCED_CODE_RE.sub(lambda m: " " * len(m.group(0)), text)
    spans = _latin(plain)
    if CJK_RE.search(plain):
        spans.extend(_chinese(plain))
    spans.sort(key=lambda s: s[0])
    unique: dict[str, None] = {}
    for _, value in spans:
        value = value.strip()
        if value:
            unique.setdefault(value)
            if len(unique) >= MAX_FACTS:
                break
    kept = _outermost(list(unique))
    return tuple(v for v in kept if fact_present(v, text))  # only what can be checked word for word


def _outermost(facts: list[str]) -> list[str]:
    """``facts`` (unique) without those contained in another of them, in order; one search of all the facts
    per fact (a fact found twice in them, with a separator between facts, is inside another)."""
    joined = "\x00".join(facts)
    if any("\x00" in f for f in facts):
        return [v for v in facts if not any(v != other and v in other for other in facts)]
    return [v for v in facts if joined.count(v) < 2]


def extract_facts(text: str) -> list[str]:
    """The facts in ``text``, in order of first appearance; each appears in ``text`` word for word.

    A fact contained in a longer fact of the same text (``4471`` in ``INC-4471``,
    ``3月14日`` in ``2025年3月14日``) is left out.  Single digits count only with a
    unit or counted noun (``3 replicas``, ``3个副本``).  Code inside fenced blocks
    is not read.

    Returns:
        Unique facts (strings), in order of first appearance.
    """
    return list(_extract(text))


def fact_present(fact: str, text: str) -> bool:
    """True when ``fact`` appears in ``text`` word for word (not inside a longer Latin word or number).

    Linear in ``len(text)`` (string searches, no pattern compiled per fact)."""
    if not fact:
        return True
    start = _ascii_alnum(fact[0])
    end = _ascii_alnum(fact[-1])
    at = text.find(fact)
    while at >= 0:
        after = at + len(fact)
        if not (start and at > 0 and _ascii_alnum(text[at - 1])) and \
                not (end and after < len(text) and _ascii_alnum(text[after])):
            return True
        at = text.find(fact, at + 1)
    return False


def _ascii_alnum(char: str) -> bool:
    return char.isascii() and char.isalnum()


def unread_share(text: str) -> float:
    """Share (0.0-1.0) of ``text``'s letters in scripts the guard does not read (neither Latin nor CJK)."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return 0.0
    unread = sum(1 for ch in letters if not (ch.isascii() or "\u00c0" <= ch <= "\u024f" or CJK_RE.match(ch)))
    return unread / len(letters)


# ------------------------------------------------------------------------------------------ checks


@dataclass(frozen=True)
class FactCheck:
    """Which expected facts a candidate memory still holds.

    Attributes:
        facts: every expected fact.
        missing: the facts found nowhere in the candidate.
    """

    facts: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def retention(self) -> float:
        """Share of expected facts kept, 0.0 to 1.0 (1.0 when there are none)."""
        if not self.facts:
            return 1.0
        return round((len(self.facts) - len(self.missing)) / len(self.facts), 4)


def check_facts(facts: Sequence[str], *texts: str | Iterable[str]) -> FactCheck:
    """Check that each fact appears word for word in one of ``texts`` (strings or lists of strings)."""
    parts: list[str] = []
    for text in texts:
        parts.extend([text] if isinstance(text, str) else list(text))
    haystack = "\n".join(parts)
    missing = tuple(f for f in facts if not fact_present(f, haystack))
    return FactCheck(tuple(facts), missing)


def facts_of(texts: Iterable[str]) -> list[str]:
    """The facts of several texts, in order, without duplicates or facts contained in a longer one."""
    facts: dict[str, None] = {}
    for text in texts:
        for fact in extract_facts(text):
            facts.setdefault(fact)
    return _outermost(list(facts))
