"""Topic labels of the quality set's conversations, for bench.quality's similar-conversation
task (issue 25): is another conversation of the same topic among the top 3 SearchService.Similar
returns for a conversation?

One topic per conversation of bench/data/chat_quality.json, judged from the conversation's
text alone and fixed before the task was first measured: what a support agent or an engineer
would file it under. Support conversations by what the customer needs, engineering ones by
what failed. Never move a conversation to another topic because a model confused them.

A topic held by one conversation only (in the whole set, any language) gives its conversation
nothing to find: it is left out of the task's scores (and counted as left out). A topic held in
one language by one conversation still scores that conversation against the topic's
conversations in the other languages: that is the cross-lingual part of the task.
"""

from __future__ import annotations

TOPICS: dict[str, str] = {
    # Support.
    # delivery: where an order is, getting it delivered (late, stuck, a failed attempt, the address).
    "c01": "delivery",
    "c02": "delivery",
    "c06": "delivery",
    "c07": "delivery",
    "c20": "delivery",
    # refund: a refund's status or where it goes.
    "c03": "refund",
    "c18": "refund",
    "c42": "refund",
    # returns: cancelling, returning or exchanging an order (wrong size, wrong colour).
    "c14": "returns",
    "c17": "returns",
    "c45": "returns",
    # payment: being charged or paying (failed, double, unmatched payments; COD, instalments).
    "c04": "payment",
    "c15": "payment",
    "c16": "payment",
    "c21": "payment",
    "c22": "payment",
    # faulty item: an item arrived damaged or broke (replacement, warranty).
    "c05": "faulty item",
    "c12": "faulty item",
    "c13": "faulty item",
    "c46": "faulty item",
    # account: signing in (password reset, OTP).
    "c08": "account",
    "c09": "account",
    # shipping fee: shipping charges and free-shipping thresholds.
    "c11": "shipping fee",
    "c41": "shipping fee",
    "c43": "shipping fee",
    # stock: an item out of stock, when it comes back.
    "c23": "stock",
    "c24": "stock",
    "c10": "voucher",  # alone
    "c19": "invoice",  # alone
    # Engineering.
    # deploy: a deploy or a schema migration failing (rollback, a lock).
    "c25": "deploy",
    "c35": "deploy",
    "c44": "deploy",
    # database: the database misbehaving (deadlocks, a slow unindexed query, a disk filled by WAL).
    "c26": "database",
    "c32": "database",
    "c34": "database",
    # capacity: a resource limit hit under load (memory, a connection pool, partitions, a rate limit).
    "c27": "capacity",
    "c28": "capacity",
    "c33": "capacity",
    "c39": "capacity",
    # credentials: an expired or rotated certificate, key or token.
    "c29": "credentials",
    "c31": "credentials",
    "c37": "credentials",
    "c38": "credentials",
    "c30": "ci test",  # alone
    "c36": "app crash",  # alone
    "c40": "meeting",  # alone: a sprint-planning reminder, noise
}
