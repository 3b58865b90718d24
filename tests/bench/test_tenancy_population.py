"""bench.tenancy's populations: the shapes the figures claim (10,000 orgs, 100,000 keys,
a long tail and four large orgs) and the orgs both populations share, alike."""

from bench import tenancypop


def test_the_large_population_has_its_orgs_and_keys():
    orgs = tenancypop.plan_orgs(tenancypop.TEN_THOUSAND)
    assert len(orgs) == 10_000
    assert sum(channels for _, _, channels in orgs) == 100_000
    sizes = sorted(windows for _, windows, _ in orgs)
    assert sizes[-4:] == [20_000, 30_000, 40_000, 50_000]
    small = sizes[:-4]
    assert 100 <= small[len(small) // 2] <= 250  # most a few hundred windows
    assert all(channels >= 1 and channels <= windows for _, windows, channels in orgs)


def test_the_shared_orgs_are_alike_in_both_populations():
    big = {org: (w, c) for org, w, c in tenancypop.plan_orgs(tenancypop.TEN_THOUSAND)}
    fifty = {org: (w, c) for org, w, c in tenancypop.plan_orgs(tenancypop.FIFTY)}
    assert len(fifty) == 50
    shared = [tenancypop.small_org(i) for i in range(tenancypop.TEN_THOUSAND.shared_small)]
    assert all(big[org] == fifty[org] for org in shared)
    assert all(big[tenancypop.large_org(s)] == fifty[tenancypop.large_org(s)] for s in tenancypop.FIFTY.large)
