"""`dwsearch dev` prints its database URL (issue 16), never a password."""

from dwsearch.stack import shown_url


def test_a_url_without_password_is_shown_as_is():
    url = "postgresql://postgres:@/postgres?host=/tmp/dwsearch/pg"
    assert shown_url(url) == url
    assert shown_url("postgresql://me@db:5432/chat") == "postgresql://me@db:5432/chat"


def test_a_password_is_hidden():
    assert shown_url("postgresql://me:s3cret@db:5432/chat?sslmode=require") == (
        "postgresql://me:***@db:5432/chat?sslmode=require"
    )
