//! A session image's memory as the pages that differ from the snapshot the session started from (the
//! plain one, or the one with pre-imported modules): a session holding `x = 1` changes a few hundred
//! pages of Pyodide's ~31 MB, so its image holds those, and a restore copies the rest from the
//! snapshot this process already has. The snapshot is named by its digest: an image made against
//! other snapshot bytes is refused rather than patched wrongly.

use super::memory_snapshot::Flavor;

/// The granularity of the comparison (one OS page).
const PAGE: usize = 4096;
/// The first bytes of a memory delta.
const MAGIC: &[u8; 8] = b"CIMDLT\0\x01";

/// Where the linear memory starts in a Pyodide memory snapshot (its second u32).
fn memory_offset(snapshot: &[u8]) -> Result<usize, String> {
    let offset = snapshot
        .get(4..8)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("the memory snapshot is cut short")?;
    if offset > snapshot.len() {
        return Err("the memory snapshot's memory offset is past its end".into());
    }
    Ok(offset)
}

/// `image` (a Pyodide memory snapshot) as its header and the pages of its linear memory that differ
/// from `base`'s (pages past the end of `base`'s that are zeros are left out too).
pub fn diff(base: &[u8], image: &[u8]) -> Result<Vec<u8>, String> {
    let (base_at, image_at) = (memory_offset(base)?, memory_offset(image)?);
    let (base_heap, heap) = (&base[base_at..], &image[image_at..]);
    let mut indices: Vec<u32> = Vec::new();
    let mut pages: Vec<u8> = Vec::new();
    for (i, page) in heap.chunks(PAGE).enumerate() {
        let start = i * PAGE;
        let same = match base_heap.get(start..start + page.len()) {
            Some(b) => b == page,
            None => page.iter().all(|&b| b == 0),
        };
        if !same {
            indices.push(u32::try_from(i).map_err(|_| "the memory is too large")?);
            pages.extend_from_slice(page);
        }
    }
    let mut out = Vec::with_capacity(image_at + pages.len() + indices.len() * 4 + 40);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(image_at as u64).to_le_bytes());
    out.extend_from_slice(&image[..image_at]);
    out.extend_from_slice(&(heap.len() as u64).to_le_bytes());
    out.extend_from_slice(&(indices.len() as u64).to_le_bytes());
    for index in &indices {
        out.extend_from_slice(&index.to_le_bytes());
    }
    out.extend_from_slice(&pages);
    Ok(out)
}

/// The memory snapshot `diff(base, image)` was made from, given `base`; an error for anything that
/// is not such a delta (never a panic: the delta comes from the store).
pub fn patch(base: &[u8], delta: &[u8], max_len: usize) -> Result<Vec<u8>, String> {
    let cut = || "the image's memory is cut short or malformed".to_string();
    let mut rest = delta.strip_prefix(MAGIC).ok_or_else(cut)?;
    let mut take = |n: usize| -> Result<&[u8], String> {
        if rest.len() < n {
            return Err(cut());
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let number = |bytes: &[u8]| -> usize {
        usize::try_from(u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
            .unwrap_or(usize::MAX)
    };
    let header_len = number(take(8)?);
    let header = take(header_len)?;
    let heap_len = number(take(8)?);
    let count = number(take(8)?);
    if header_len.saturating_add(heap_len) > max_len || count > heap_len.div_ceil(PAGE) {
        return Err("the image's memory is larger than a sandbox's".into());
    }
    let indices = take(count.checked_mul(4).ok_or_else(cut)?)?.to_vec();
    let pages = rest;
    let base_heap = &base[memory_offset(base)?..];
    let mut out = Vec::with_capacity(header_len + heap_len);
    out.extend_from_slice(header);
    out.extend_from_slice(&base_heap[..base_heap.len().min(heap_len)]);
    out.resize(header_len + heap_len, 0);
    let mut offset = 0usize;
    let mut last: Option<usize> = None;
    for index in indices.chunks_exact(4) {
        let index = u32::from_le_bytes([index[0], index[1], index[2], index[3]]) as usize;
        if last.is_some_and(|l| index <= l) {
            return Err(cut());
        }
        last = Some(index);
        let start = index
            .checked_mul(PAGE)
            .filter(|&s| s < heap_len)
            .ok_or_else(cut)?;
        let len = PAGE.min(heap_len - start);
        let page = pages.get(offset..offset + len).ok_or_else(cut)?;
        out[header_len + start..header_len + start + len].copy_from_slice(page);
        offset += len;
    }
    if offset != pages.len() {
        return Err(cut());
    }
    Ok(out)
}

/// How an image names the snapshot kind it is based on.
pub fn flavor_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Plain => "plain",
        Flavor::Preimported => "preimported",
    }
}

/// The snapshot kind an image names.
pub fn flavor_named(name: &str) -> Option<Flavor> {
    match name {
        "plain" => Some(Flavor::Plain),
        "preimported" => Some(Flavor::Preimported),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{diff, patch};

    fn snapshot(header: &[u8], heap: &[u8]) -> Vec<u8> {
        let offset = 8 + header.len();
        let mut out = vec![0u8; 4];
        out.extend_from_slice(&(offset as u32).to_le_bytes());
        out.extend_from_slice(header);
        out.extend_from_slice(heap);
        out
    }

    #[test]
    fn a_delta_holds_the_changed_pages_and_patches_back_exactly() {
        let base_heap: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let base = snapshot(b"base header", &base_heap);
        let mut heap = base_heap.clone();
        heap[5000] ^= 1;
        heap[20_000..20_100].fill(0);
        heap.extend_from_slice(&[0u8; 8192]);
        heap.extend_from_slice(&[9u8; 100]);
        let image = snapshot(b"a longer header than the base's", &heap);
        let delta = diff(&base, &image).unwrap();
        assert!(delta.len() < 5 * 4096 + 200, "{}", delta.len());
        assert_eq!(patch(&base, &delta, 1 << 20).unwrap(), image);
        // Shorter than the base, too.
        let short = snapshot(b"h", &base_heap[..10_000]);
        assert_eq!(
            patch(&base, &diff(&base, &short).unwrap(), 1 << 20).unwrap(),
            short
        );
        // Anything cut or changed in its framing is an error, never a panic.
        for cut in [0, 7, 8, 20, delta.len() - 1] {
            assert!(patch(&base, &delta[..cut], 1 << 20).is_err(), "{cut}");
        }
        assert!(patch(&base, &delta, 100).is_err(), "over the size bound");
    }
}
