//! Semantic partition on constructed vectors.

use rlx_signals::partition::{cosine, partition};

/// A unit vector at `deg` degrees in the plane.
fn at(deg: f64) -> Vec<f32> {
    let r = deg.to_radians();
    vec![r.cos() as f32, r.sin() as f32]
}

#[test]
fn cosine_values() {
    assert!((cosine(&[1.0, 0.0], &[0.0, 2.0]).unwrap()).abs() < 1e-12);
    assert!((cosine(&[1.0, 1.0], &[2.0, 2.0]).unwrap() - 1.0).abs() < 1e-12);
    assert!((cosine(&[1.0, 0.0], &[-3.0, 0.0]).unwrap() + 1.0).abs() < 1e-12);
    assert!(cosine(&[1.0], &[1.0, 0.0]).is_err());
    assert!(cosine(&[0.0, 0.0], &[1.0, 0.0]).is_err());
}

#[test]
fn union_find_is_transitive() {
    // 0°, 25°, 50°: neighbours are 25° apart (cos 0.906), the ends 50° apart (cos 0.643).
    // With threshold 0.9, 0–1 and 1–2 link, so 0 and 2 share a class through 1.
    let e = vec![at(0.0), at(25.0), at(50.0), at(120.0)];
    assert_eq!(partition(&e, 0.9).unwrap(), vec![0, 0, 0, 1]);
    // Order matters only for the numbering: the chain found from its middle first.
    let e = vec![at(120.0), at(50.0), at(0.0), at(25.0)];
    assert_eq!(partition(&e, 0.9).unwrap(), vec![0, 1, 1, 1]);
}

#[test]
fn classes_numbered_by_first_appearance() {
    let e = vec![at(90.0), at(0.0), at(91.0), at(180.0), at(1.0)];
    assert_eq!(partition(&e, 0.99).unwrap(), vec![0, 1, 0, 2, 1]);
}

#[test]
fn threshold_is_inclusive() {
    // Exactly representable: cos((1,0),(1,1)) = 1/√2; with threshold at that value they link.
    let a = vec![1.0f32, 0.0];
    let b = vec![1.0f32, 1.0];
    let c = cosine(&a, &b).unwrap();
    assert_eq!(partition(&[a.clone(), b.clone()], c).unwrap(), vec![0, 0]);
    assert_eq!(partition(&[a, b], c + 1e-12).unwrap(), vec![0, 1]);
}

#[test]
fn extreme_thresholds_and_edge_groups() {
    let e = vec![at(0.0), at(90.0), at(180.0)];
    assert_eq!(partition(&e, -1.0).unwrap(), vec![0, 0, 0]);
    assert_eq!(partition(&e, 1.0).unwrap(), vec![0, 1, 2]);
    // Identical vectors have cosine 1 and link at threshold 1.
    assert_eq!(partition(&[at(10.0), at(10.0)], 1.0).unwrap(), vec![0, 0]);
    assert_eq!(partition(&[], 0.5).unwrap(), Vec::<i32>::new());
    assert_eq!(partition(&[at(3.0)], 0.5).unwrap(), vec![0]);
}

#[test]
fn bad_embeddings_are_errors() {
    assert_eq!(
        partition(&[vec![1.0, 0.0], vec![1.0]], 0.5).unwrap_err(),
        "embedding of response 1 has 1 dimensions, response 0 has 2"
    );
    assert_eq!(
        partition(&[vec![1.0, f32::NAN]], 0.5).unwrap_err(),
        "embedding of response 0 has a non-finite value NaN"
    );
    assert_eq!(
        partition(&[vec![1.0], vec![0.0]], 0.5).unwrap_err(),
        "embedding of response 1 is the zero vector (no cosine similarity)"
    );
    assert_eq!(
        partition(&[vec![1.0]], f64::NAN).unwrap_err(),
        "threshold must be finite, got NaN"
    );
}
