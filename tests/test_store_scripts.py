"""Every Lua script is a named file under app/store/lua/ (docs/architecture.md), never a string in Python."""

from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"


def test_no_python_module_holds_an_inline_lua_script():
    offenders = [str(p.relative_to(APP)) for p in APP.rglob("*.py")
                 if "redis.call(" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_every_script_file_is_loaded_by_the_store():
    lua = APP / "store" / "lua"
    sources = "".join(p.read_text(encoding="utf-8") for p in (APP / "store").glob("*.py"))
    unused = [p.name for p in lua.glob("*.lua") if f'"{p.name}"' not in sources]
    assert unused == []
