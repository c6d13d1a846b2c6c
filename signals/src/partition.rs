//! Semantic partition of a group's responses from their embeddings (DARLING's equivalence classes,
//! approximated by embedding similarity): two responses are linked when the cosine similarity of their
//! embeddings is at least `threshold`; classes are the connected components (union-find, so linking is
//! transitive), numbered 0, 1, … by the first response of each class.

/// Cosine similarity of two vectors of the same length. Errors on different lengths, non-finite
/// components or a zero vector (its direction, hence its similarity, is undefined).
pub fn cosine(a: &[f32], b: &[f32]) -> Result<f64, String> {
    if a.len() != b.len() {
        return Err(format!(
            "embeddings of different lengths: {} and {}",
            a.len(),
            b.len()
        ));
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return Err("a zero embedding vector has no cosine similarity".to_string());
    }
    // √(na·nb) rather than √na·√nb: for identical vectors na·nb rounds to dot², whose correctly rounded
    // square root is dot again, so a vector's similarity to itself is exactly 1.
    Ok((dot / (na * nb).sqrt()).clamp(-1.0, 1.0))
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Class ids of `embeddings` (one group): `cos(e_i, e_j) ≥ threshold` links i and j; ids number the
/// connected components by first appearance. `threshold` must be finite (a value above 1 links
/// nothing, at most −1 links everything). Errors name the offending response (0-based).
pub fn partition(embeddings: &[Vec<f32>], threshold: f64) -> Result<Vec<i32>, String> {
    if !threshold.is_finite() {
        return Err(format!("threshold must be finite, got {threshold}"));
    }
    for (i, e) in embeddings.iter().enumerate() {
        if e.is_empty() {
            return Err(format!("embedding of response {i} is empty"));
        }
        if let Some(x) = e.iter().find(|x| !x.is_finite()) {
            return Err(format!(
                "embedding of response {i} has a non-finite value {x}"
            ));
        }
        if e.iter().all(|&x| x == 0.0) {
            return Err(format!(
                "embedding of response {i} is the zero vector (no cosine similarity)"
            ));
        }
        if e.len() != embeddings[0].len() {
            return Err(format!(
                "embedding of response {i} has {} dimensions, response 0 has {}",
                e.len(),
                embeddings[0].len()
            ));
        }
    }
    let n = embeddings.len();
    let mut parent: Vec<usize> = (0..n).collect();
    for i in 0..n {
        for j in i + 1..n {
            if cosine(&embeddings[i], &embeddings[j])? >= threshold {
                let (ri, rj) = (find(&mut parent, i), find(&mut parent, j));
                if ri != rj {
                    parent[ri.max(rj)] = ri.min(rj);
                }
            }
        }
    }
    let mut ids = vec![-1i32; n];
    let mut root_id: Vec<Option<i32>> = vec![None; n];
    let mut next = 0;
    for (i, id) in ids.iter_mut().enumerate() {
        let r = find(&mut parent, i);
        *id = *root_id[r].get_or_insert_with(|| {
            next += 1;
            next - 1
        });
    }
    Ok(ids)
}
