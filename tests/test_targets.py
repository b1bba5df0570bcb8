"""fastfeed.targets: the one rule for what a stored annotation becomes in training (clip to the image, drop what
has no area left, leave crowd regions out), the same rule as pack's report, and the checks of a stored annotation."""
from __future__ import annotations

import numpy as np
import pytest

from fastfeed.targets import annotation_issues, build_targets, check_annotation

W, H = 100, 50


def test_boxes_are_clipped_to_the_image_and_empty_ones_dropped():
    anns = [
        {"boxes": [[-5, 10, 20, 30], [90, 40, 130, 70], [200, 0, 210, 10], [5, 5, 5, 9]], "labels": [0, 1, 2, 3]},
        None,
        {"boxes": [[1, 2, 3, 4]], "labels": [4]},
    ]
    t = build_targets(anns, [W, 7, W], [H, 7, H])
    assert len(t) == 3 and [t.count(i) for i in range(3)] == [2, 0, 1]
    boxes, labels = t.of(0)
    assert boxes.tolist() == [[0, 10, 20, 30], [90, 40, 100, 50]] and labels.tolist() == [0, 1]
    assert t.of(1)[0].shape == (0, 4)
    assert t.of(2)[1].tolist() == [4]
    # pack's report names exactly the objects that build_targets changed
    assert [j for j, _ in annotation_issues(anns[0], W, H)] == [0, 1, 2, 3]
    reasons = [why for _, why in annotation_issues(anns[0], W, H)]
    assert "clipped" in reasons[0] and "clipped" in reasons[1]
    assert "outside the image" in reasons[2] and "zero size" in reasons[3]
    assert annotation_issues(anns[2], W, H) == []


def test_the_report_judges_area_in_the_tables_float32():
    # x1 - x0 = 1e-4 px at x = 5000 is a width in float64, none in float32: build_targets drops it, and the
    # report says so
    ann = {"boxes": [[5000.0, 1.0, 5000.0001, 6.0], [10.0, 1.0, 10.5, 6.0]], "labels": [0, 0]}
    assert np.float32(5000.0001) == np.float32(5000.0)
    assert build_targets([ann], [6000], [8]).count(0) == 1
    assert [(j, why.endswith("of zero size (6000x8): dropped")) for j, why in annotation_issues(ann, 6000, 8)] == [
        (0, True)]


def test_crowd_regions_are_kept_in_the_table_but_not_trained_on():
    ann = {"boxes": [[0, 0, 10, 10], [20, 20, 40, 40], [50, 0, 60, 5]], "labels": [0, 1, 2], "iscrowd": [0, 1, 0]}
    t = build_targets([ann], [W], [H])
    assert t.count(0) == 3 and t.iscrowd.tolist() == [False, True, False]
    boxes, labels = t.of(0)
    assert labels.tolist() == [0, 2] and boxes.tolist() == [[0, 0, 10, 10], [50, 0, 60, 5]]


def test_polygons_follow_their_objects_through_the_drop():
    ann = {"boxes": [[0, 0, 10, 10], [300, 300, 310, 310], [20, 0, 30, 10]], "labels": [0, 0, 1],
           "polygons": [[[0, 0, 10, 0, 10, 10]], [[300, 300, 310, 300, 310, 310]],
                        [[20, 0, 30, 0, 30, 10], [21, 1, 22, 1, 22, 2]]]}
    t = build_targets([ann], [W], [H])
    polys = t.polygons_of(0)
    assert [len(p) for p in polys] == [1, 2]
    assert np.array_equal(polys[1][1], np.array([[21, 1], [22, 1], [22, 2]], np.float32))


@pytest.mark.parametrize("ann, why", [
    ([1, 2], "not a JSON object"),
    ({"boxes": [[0, 0, 1, 1]], "labels": []}, "equal length"),
    ({"boxes": [[0, 0, 1]], "labels": [0]}, "four finite numbers"),
    ({"boxes": [[0, 0, 1, float("nan")]], "labels": [0]}, "four finite numbers"),
    ({"boxes": [[0, 0, 1, 1]], "labels": [3]}, "class index"),
    ({"boxes": [[0, 0, 1, 1]], "labels": [True]}, "class index"),
    ({"boxes": [[0, 0, 1, 1]], "labels": [0], "iscrowd": []}, "'iscrowd'"),
    ({"boxes": [[0, 0, 1, 1]], "labels": [0], "difficult": [0, 1]}, "'difficult'"),
    ({"boxes": [[0, 0, 1, 1]], "labels": [0], "polygons": [[[0, 0, 1, 1]]]}, "three x, y pairs"),
])
def test_a_malformed_annotation_is_named(ann, why):
    assert why in check_annotation(ann, num_classes=3)


def test_a_well_formed_annotation_passes():
    ann = {"boxes": [[0, 0, 1, 1]], "labels": [2], "iscrowd": [1], "rle": [{"size": [2, 2], "counts": "04"}],
           "difficult": [0], "polygons": [[[0, 0, 1, 0, 1, 1]]]}
    assert check_annotation(ann, num_classes=3) is None
    assert check_annotation(None, num_classes=3) is None
