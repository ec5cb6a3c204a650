"""The fact guard's reader: the exact facts it finds in English and in Chinese text (no model, no store)."""

from __future__ import annotations

import pytest

from app.memory.compaction.facts import (
    check_facts,
    extract_facts,
    fact_present,
    facts_of,
    states_decision,
    unread_share,
)

ENGLISH = [
    ('Hi, my name is Lin Wei.', ['Lin Wei']),
    ('The incident ticket is INC-4471.', ['INC-4471']),
    ('The outage started on 14 March 2025 at 09:20 UTC.', ['14 March 2025', '09:20 UTC']),
    ('We ship on March 15, 2025.', ['March 15, 2025']),
    ('Deadline: 2025-04-02.', ['2025-04-02']),
    ('The invoice is dated 3/15/2024.', ['3/15/2024']),
    ('I weigh 68 kg.', ['68 kg']),
    ('We run 3 replicas in eu-west-2.', ['3 replicas', 'eu-west-2']),
    ('The budget is 9000 euros.', ['9000 euros']),
    ('It costs $300 per month.', ['$300']),
    ('We lost 12,000 requests, about 3.5% of traffic.', ['12,000 requests', '3.5%']),
    ('Set the flag `billing_v2` to true.', ['billing_v2']),
    ('Call getUser() from the OrderService class.', ['getUser', 'OrderService']),
    ('We rent H100 nodes from Lambda.', ['H100', 'Lambda']),
    ('Ask Marta Kowalski about it.', ['Marta Kowalski']),
    ('I live in Rotterdam and work for Northwind.', ['Rotterdam', 'Northwind']),
    ("My colleague O'Brien moved to Dublin last year.", ["O'Brien", 'Dublin']),
    ('Version v2.3.1 fixed the bug.', ['v2.3.1']),
    ('The meeting is at 2:30 pm.', ['2:30 pm']),
    ('Our SLA is 99.9% for the EU region.', ['SLA', '99.9%', 'EU']),
    ('The order QV-58213 was shipped in June 2024.', ['QV-58213', 'June 2024']),
    ('Paris is lovely in spring.', []),
    ('I have 2 kids and 1 dog.', ['2 kids', '1 dog']),
    ('The latency dropped to 20 ms after the fix.', ['20 ms']),
    ("Hi! How are you today? I'm fine, thanks.", []),
    ("Sure, let's keep going with the plan.", []),
    ('Thanks a lot for the help!', []),
    ('We decided to use PostgreSQL 16 instead of MySQL.', ['PostgreSQL', '16', 'MySQL']),
    ('I prefer answers in bullet points.', []),
    ('The server has 64 GB of memory and 16 cores.', ['64 GB', '16 cores']),
]

CHINESE = [
    ('我叫林伟。', ['林伟']),
    ('工单号是INC-4471。', ['INC-4471']),
    ('我们决定把数据库迁移推迟到4月2日，负责人是王芳。', ['4月2日', '王芳']),
    ('项目在2025年3月14日上线。', ['2025年3月14日']),
    ('预算为9000欧元。', ['9000欧元']),
    ('我住在杭州西湖区。', ['杭州', '西湖区']),
    ('下周三去上海出差。', ['下周三', '上海']),
    ('集群需要3个副本。', ['3个副本']),
    ('会议定在下午三点半。', ['下午三点半']),
    ('地址是张江路88号。', ['张江路', '88号']),
    ('服务器有16核，内存64GB。', ['16核', '64GB']),
    ('我今年35岁。', ['35岁']),
    ('体重68公斤。', ['68公斤']),
    ('延迟低于20ms。', ['20ms']),
    ('张伟和李娜明天去北京开会。', ['张伟', '李娜', '北京']),
    ('预算两万元。', ['两万元']),
    ('订单号QV-58213已经发货。', ['QV-58213']),
    ('客户陈静来自深圳。', ['陈静', '深圳']),
    ('版本v2.3.1修复了这个问题。', ['v2.3.1']),
    ('我们不做移动端，先做网页版。', []),
    ('我喜欢简洁的回答。', []),
    ('合同在2024年6月签的。', ['2024年6月']),
    ('早上9点20分服务中断了。', ['早上9点20分']),
    ('可用性要达到99.9%。', ['99.9%']),
    ('星期五下午开评审会。', ['星期五']),
    ('我们买了两台服务器。', ['两台服务器']),
    ('你好！今天怎么样？', []),
    ('好的，谢谢你的帮助。', []),
    ('请用一句话回答：什么是数据库索引？', []),
    ('欧阳娜娜在成都工作。', ['欧阳娜娜', '成都']),
    ('项目经理是刘洋，周五之前要交付。', ['刘洋', '周五']),
]


@pytest.mark.parametrize("text, facts", ENGLISH)
def test_english_facts_are_extracted_exactly(text, facts):
    assert extract_facts(text) == facts


@pytest.mark.parametrize("text, facts", CHINESE)
def test_chinese_facts_are_extracted_exactly(text, facts):
    assert extract_facts(text) == facts


def test_there_are_at_least_thirty_cases_per_language():
    assert len(ENGLISH) >= 30 and len(CHINESE) >= 30


def test_identifiers_next_to_chinese_characters_are_found_whole():
    assert extract_facts("我叫林伟，工单号是INC-4471，预算为9000欧元，2025年3月14日上线。") == [
        "林伟", "INC-4471", "9000欧元", "2025年3月14日"]


def test_a_fact_inside_a_longer_one_is_left_out():
    assert extract_facts("INC-4471 and 4471") == ["INC-4471"]
    assert extract_facts("2025年3月14日，也就是3月14日") == ["2025年3月14日"]


def test_code_in_fenced_blocks_is_not_read():
    assert extract_facts("Use this:\n```python\nuser_id = getUser(42)\n```\nand ask Marta Kowalski.") == [
        "Marta Kowalski"]


def test_every_fact_appears_word_for_word_in_its_source():
    for text, _ in ENGLISH + CHINESE:
        assert all(fact_present(f, text) for f in extract_facts(text))


def test_facts_are_checked_word_for_word_with_ascii_boundaries():
    assert fact_present("INC-4471", "工单号是INC-4471。") is True
    assert fact_present("INC-4471", "INC-44710") is False
    assert fact_present("王芳", "负责人是王芳") is True
    assert fact_present("68 kg", "weighs 68 kgs") is False


def test_retention_on_chinese_text_is_the_real_ratio():
    facts = extract_facts("我们决定把数据库迁移推迟到4月2日，负责人是王芳。预算为9000欧元。")
    assert facts == ["4月2日", "王芳", "9000欧元"]
    check = check_facts(facts, "迁移推迟到4月2日。", ["预算9000欧元"])
    assert check.missing == ("王芳",)
    assert check.retention == 0.6667


def test_facts_of_several_texts_keeps_the_longer_of_overlapping_facts():
    assert facts_of(["ticket 4471", "ticket INC-4471"]) == ["INC-4471"]


@pytest.mark.parametrize("text", ["We decided to use PostgreSQL 16.", "I prefer answers in bullet points.",
                                  "We will not build a mobile app.", "我们决定把数据库迁移推迟到4月2日。",
                                  "我们不做移动端。", "我喜欢简洁的回答。", "From now on, answer in French."])
def test_decisions_and_preferences_are_recognized(text):
    assert states_decision(text) is True


@pytest.mark.parametrize("text", ["What is a database index?", "The weather is nice.", "今天天气很好。",
                                  "请用一句话回答：什么是数据库索引？"])
def test_plain_sentences_are_not_decisions(text):
    assert states_decision(text) is False


def test_unread_scripts_are_measured_not_counted_as_checked():
    assert unread_share("Привет, меня зовут Иван") > 0.9
    assert unread_share("我叫林伟 and I live in Rotterdam") == 0.0
    assert extract_facts("Привет, меня зовут Иван") == []
