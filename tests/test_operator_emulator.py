"""walras_testbed.emulator (the emulated Kubernetes API of the demo and the tests): selectors, patches, metadata,
sub-resources, finalizers, garbage collection, CRD registration and watch resumption, over HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from walras_testbed.emulator import (
    ApiError,
    Emulator,
    FieldSelector,
    LabelSelector,
    SelectorError,
    json_patch,
    merge_patch,
)
from walras_testbed.emulator.store import Store, apply_defaults


def pod(name: str, labels: dict[str, str] | None = None, ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "widgets.example.dev"},
       "spec": {"group": "example.dev", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wdg"]},
                "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                              "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                  "spec": {"type": "object", "properties": {
                                      "size": {"type": "integer", "default": 3}}}}}}}]}}


def test_label_and_field_selectors() -> None:
    obj = {"metadata": {"name": "a", "labels": {"app": "web", "tier": "front"}}, "spec": {"nodeName": "n1"}}
    assert LabelSelector.parse("app=web,tier in (front, back),!missing").matches(obj)
    assert not LabelSelector.parse("app!=web").matches(obj)
    assert LabelSelector.parse("tier notin (db),app").matches(obj)
    assert not LabelSelector.parse("missing").matches(obj)
    assert FieldSelector.parse("spec.nodeName=n1,metadata.name!=b").matches(obj)
    assert FieldSelector.parse("spec.nodeName=").matches({"spec": {}})
    with pytest.raises(SelectorError):
        FieldSelector.parse("spec.nodeName")
    with pytest.raises(SelectorError):
        LabelSelector.parse("app in web")


def test_patches() -> None:
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    assert merge_patch(doc, {"a": {"b": None, "e": 2}, "d": "y"}) == {"a": {"c": [1, 2], "e": 2}, "d": "y"}
    patched = json_patch(doc, [{"op": "add", "path": "/a/c/-", "value": 3}, {"op": "replace", "path": "/d",
                                                                               "value": "z"},
                               {"op": "remove", "path": "/a/b"}, {"op": "copy", "from": "/d", "path": "/f"},
                               {"op": "test", "path": "/f", "value": "z"}])
    assert patched == {"a": {"c": [1, 2, 3]}, "d": "z", "f": "z"}
    assert doc == {"a": {"b": 1, "c": [1, 2]}, "d": "x"}  # not mutated
    with pytest.raises(ApiError, match="test failed"):
        json_patch(doc, [{"op": "test", "path": "/d", "value": "nope"}])
    assert apply_defaults({"spec": {}}, CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == {
        "spec": {"size": 3}}


def test_store_metadata_binding_finalizers_and_gc() -> None:
    store = Store()
    pods = store.types[("", "v1", "pods")]
    created = store.create(pods, "default", pod("p"))
    meta = created["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert created["status"]["phase"] == "Pending"
    relabelled = store.patch(pods, "default", "p", {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json")
    assert relabelled["metadata"]["generation"] == 1  # metadata only: no new generation
    with pytest.raises(ApiError) as err:
        store.create(pods, "default", pod("p"))
    assert err.value.code == 409 and err.value.reason == "AlreadyExists"
    with pytest.raises(ApiError) as err:
        store.replace(pods, "default", "p", {**created, "metadata": {**meta, "resourceVersion": "1"}})
    assert err.value.reason == "Conflict"
    store.bind("default", "p", {"target": {"name": "n1"}})
    bound = store.get(pods, "default", "p")
    assert bound["spec"]["nodeName"] == "n1" and bound["status"]["phase"] == "Running"
    with pytest.raises(ApiError) as err:
        store.bind("default", "p", {"target": {"name": "n2"}})
    assert err.value.code == 409
    assert len(store.bindings) == 1
    # owner references: deleting the owner deletes the dependent
    owner = store.create(store.types[("", "v1", "configmaps")], "default", {"metadata": {"name": "owner"}})
    dep = pod("dep")
    dep["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                           "uid": owner["metadata"]["uid"]}]
    store.create(pods, "default", dep)
    store.delete(store.types[("", "v1", "configmaps")], "default", "owner")
    with pytest.raises(ApiError):
        store.get(pods, "default", "dep")
    # finalizers: delete marks, removing the last finalizer deletes
    held = pod("held")
    held["metadata"]["finalizers"] = ["x/y"]
    store.create(pods, "default", held)
    assert store.delete(pods, "default", "held")["metadata"]["deletionTimestamp"]
    assert store.get(pods, "default", "held")
    store.patch(pods, "default", "held", {"metadata": {"finalizers": None}}, "application/merge-patch+json")
    with pytest.raises(ApiError):
        store.get(pods, "default", "held")


def test_crd_registration_status_subresource_and_generation() -> None:
    store = Store()
    store.create(store.types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")], "", CRD)
    widgets = store.find("example.dev", "v1", "widgets")
    assert widgets.namespaced and widgets.short_names == ("wdg",)
    w = store.create(widgets, "default", {"apiVersion": "example.dev/v1", "kind": "Widget",
                                          "metadata": {"name": "w"}, "spec": {}, "status": {"ignored": True}})
    assert w["spec"] == {"size": 3} and "status" not in w
    w = store.patch(widgets, "default", "w", {"status": {"phase": "Up"}}, "application/merge-patch+json", "status")
    assert w["status"] == {"phase": "Up"} and w["metadata"]["generation"] == 1
    w = store.patch(widgets, "default", "w", {"spec": {"size": 5}, "status": {"phase": "Down"}},
                    "application/merge-patch+json")
    assert w["metadata"]["generation"] == 2 and w["status"] == {"phase": "Up"}  # status only via /status
    store.delete(store.types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")], "", "widgets.example.dev")
    with pytest.raises(ApiError):
        store.find("example.dev", "v1", "widgets")


@pytest.mark.asyncio
async def test_http_discovery_list_watch_and_faults() -> None:
    emulator = Emulator()
    url = await emulator.start()
    try:
        async with aiohttp.ClientSession() as s:
            api = await (await s.get(f"{url}/api/v1")).json()
            pods_entry = next(r for r in api["resources"] if r["name"] == "pods")
            assert pods_entry["kind"] == "Pod" and "watch" in pods_entry["verbs"] and pods_entry["shortNames"] == ["po"]
            assert any(r["name"] == "pods/binding" for r in api["resources"])
            resp = await s.post(f"{url}/api/v1/namespaces/default/pods", json=pod("a", {"app": "web"}))
            assert resp.status == 201
            listing = await (await s.get(f"{url}/api/v1/namespaces/default/pods",
                                         params={"labelSelector": "app=web"})).json()
            assert listing["kind"] == "PodList" and [i["metadata"]["name"] for i in listing["items"]] == ["a"]
            rv = listing["metadata"]["resourceVersion"]
            await s.post(f"{url}/api/v1/namespaces/default/pods", json=pod("b", {"app": "db"}))
            await s.post(f"{url}/api/v1/namespaces/default/pods", json=pod("c", {"app": "web"}))
            seen = []
            async with s.get(f"{url}/api/v1/pods", params={"watch": "true", "resourceVersion": rv,
                                                           "labelSelector": "app=web", "timeoutSeconds": "1"}) as w:
                async for line in w.content:
                    event = json.loads(line)
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
            assert seen == [("ADDED", "c")]  # resumed after rv, filtered by label
            await s.post(f"{url}/_emulator/faults", json={"verb": "patch", "resource": "pods", "code": 429})
            patch = {"metadata": {"labels": {"x": "1"}}}
            headers = {"Content-Type": "application/merge-patch+json"}
            first = await s.patch(f"{url}/api/v1/namespaces/default/pods/a", data=json.dumps(patch), headers=headers)
            second = await s.patch(f"{url}/api/v1/namespaces/default/pods/a", data=json.dumps(patch), headers=headers)
            assert (first.status, second.status) == (429, 200)
            assert (await first.json())["reason"] == "TooManyRequests"
            missing = await s.get(f"{url}/api/v1/namespaces/default/pods/zzz")
            assert missing.status == 404 and (await missing.json())["kind"] == "Status"
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"}, "target": {"name": "n1"}}
            ok = await s.post(f"{url}/api/v1/namespaces/default/pods/a/binding", json=binding)
            again = await s.post(f"{url}/api/v1/namespaces/default/pods/a/binding", json=binding)
            assert (ok.status, again.status) == (201, 409)
    finally:
        await emulator.stop()
        await asyncio.sleep(0)


def _running(store: Store, name: str, labels: dict[str, str], ready: bool = True) -> None:
    pods = store.types[("", "v1", "pods")]
    store.create(pods, "default", pod(name, labels))
    store.patch(pods, "default", name, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}, "application/merge-patch+json",
        subresource="status")


def _budget(store: Store, name: str, spec: dict[str, Any]) -> None:
    store.create(store.types[("policy", "v1", "poddisruptionbudgets")], "default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "w"}}, **spec}})


@pytest.mark.parametrize(("spec", "ready", "evictable"), [
    ({"minAvailable": 2}, 3, 1),  # 3 healthy, 2 needed: one eviction
    ({"minAvailable": "50%"}, 4, 2),  # ceil(50 % of 4) = 2 needed
    ({"minAvailable": "60%"}, 4, 1),  # ceil(2.4) = 3 needed
    ({"maxUnavailable": 1}, 3, 1),
    ({"maxUnavailable": "50%"}, 3, 2),  # ceil(1.5) = 2 may be unavailable
    ({"minAvailable": 0}, 2, 2),
])
def test_evictions_stop_where_the_budget_would_be_violated(spec: dict[str, Any], ready: int, evictable: int) -> None:
    """Issue 17: ``pods/eviction`` honours a PodDisruptionBudget (integer or percent, minAvailable or
    maxUnavailable over the matching pods): exactly ``evictable`` pods go, then 429 with a DisruptionBudget cause."""
    store = Store()
    pods = store.types[("", "v1", "pods")]
    for i in range(ready):
        _running(store, f"w{i}", {"app": "w"})
    _budget(store, "b", spec)
    evicted = 0
    for i in range(ready):
        try:
            answer = store.evict("default", f"w{i}", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                      "metadata": {"name": f"w{i}"}})
        except ApiError as exc:
            assert exc.code == 429 and exc.reason == "TooManyRequests"
            assert exc.status()["details"]["causes"][0]["reason"] == "DisruptionBudget"
            continue
        assert answer["code"] == 201 and answer["status"] == "Success"
        evicted += 1
    assert evicted == evictable
    assert len(store.list(pods, "default")) == ready - evictable


def test_evictions_outside_budgets_pending_pods_and_two_budgets() -> None:
    store = Store()
    pods = store.types[("", "v1", "pods")]
    _running(store, "a", {"app": "w"})
    _running(store, "other", {"app": "x"})
    store.create(pods, "default", pod("pending", {"app": "w"}))
    _budget(store, "b", {"minAvailable": 1})
    # a pod no budget selects goes; a Pending pod goes without looking at the budget (as kube-apiserver's
    # canIgnorePDB); the last Ready pod under minAvailable 1 stays
    assert store.evict("default", "other", {"kind": "Eviction"})["code"] == 201
    assert store.evict("default", "pending", {"kind": "Eviction"})["code"] == 201
    with pytest.raises(ApiError) as refused:
        store.evict("default", "a", {"kind": "Eviction"})
    assert refused.value.code == 429
    with pytest.raises(ApiError) as mismatch:
        store.evict("default", "a", {"kind": "Eviction", "metadata": {"name": "b"}})
    assert mismatch.value.code == 400
    _budget(store, "b2", {"maxUnavailable": 1})
    with pytest.raises(ApiError) as two:
        store.evict("default", "a", {"kind": "Eviction"})
    assert two.value.code == 500 and "more than one PodDisruptionBudget" in two.value.message
    with pytest.raises(ApiError) as missing:
        store.evict("default", "gone", {"kind": "Eviction"})
    assert missing.value.code == 404
