import psycopg
import pytest

from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG, enabled_orgs, semantic_search_enabled
from dwsearch_testkit.seed import enable_semantic_search, set_org_flag


async def check(url, org):
    async with await psycopg.AsyncConnection.connect(url) as conn:
        return await semantic_search_enabled(conn, org), await enabled_orgs(conn)


async def test_admin_flag_is_seeded_off(db_url):
    set_org_flag(db_url, "org-a", MODULE_FLAG, True)
    set_org_flag(db_url, "org-a", SEMANTIC_SEARCH_FLAG, True)
    assert await check(db_url, "org-a") == (False, [])


async def test_all_three_flags_on(db_url):
    enable_semantic_search(db_url, "org-a", "org-b")
    assert await check(db_url, "org-a") == (True, ["org-a", "org-b"])


@pytest.mark.parametrize("flag", [MODULE_FLAG, SEMANTIC_SEARCH_FLAG])
async def test_any_org_flag_off_disables(db_url, flag):
    enable_semantic_search(db_url, "org-a", "org-b")
    set_org_flag(db_url, "org-a", flag, False)
    assert await check(db_url, "org-a") == (False, ["org-b"])


async def test_unknown_org_is_disabled(db_url):
    enable_semantic_search(db_url, "org-a")
    assert (await check(db_url, "nobody"))[0] is False
