//! The fuzzer's seed corpus (`proto/fuzz/seeds/decode/`) is made from the hex vectors, so
//! libFuzzer starts past the frame magic with every frame type, flag and rejection the
//! vectors show. This test keeps the seeds in step with the vectors.
//!
//! The `decode` target reads its first byte as the point where the input is split into two
//! chunks. Each vector gives two seeds: `<name>.whole` (split at 255: one chunk) and
//! `<name>.split` (split after the 10-byte header). `all-frames.stream` is every frame
//! vector back to back, split inside the first frame.
//!
//! To regenerate after the vectors changed: `FELIX_BLESS=1 cargo test -p felix-proto --test
//! fuzz_seeds`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const WHOLE: u8 = 255;
const AFTER_HEADER: u8 = 10;
const INSIDE_FIRST: u8 = 7;

fn proto_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn hex_bytes(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// Every vector, by name, in name order.
fn vectors() -> BTreeMap<String, Vec<u8>> {
    let dir = proto_dir().join("tests/vectors");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("tests/vectors") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "hex") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.insert(name, hex_bytes(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    out
}

/// The seed files the vectors make: name → contents.
fn seeds() -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stream = vec![INSIDE_FIRST];
    for (name, bytes) in vectors() {
        out.insert(format!("{name}.whole"), [&[WHOLE][..], &bytes].concat());
        out.insert(format!("{name}.split"), [&[AFTER_HEADER][..], &bytes].concat());
        if !name.starts_with("reject_") {
            stream.extend_from_slice(&bytes);
        }
    }
    out.insert("all-frames.stream".into(), stream);
    out
}

fn seed_dir() -> PathBuf {
    proto_dir().join("fuzz/seeds/decode")
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect()
}

#[test]
fn seeds_are_the_vectors() {
    let want = seeds();
    assert!(want.len() > 2 * 20, "every vector makes seeds");
    let dir = seed_dir();
    if std::env::var_os("FELIX_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &want {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let have = files(&dir);
    assert_eq!(
        have.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{} is out of step with tests/vectors (run with FELIX_BLESS=1)",
        dir.display()
    );
    for (name, bytes) in &want {
        assert_eq!(&have[name], bytes, "seed {name} (run with FELIX_BLESS=1)");
    }
}

#[test]
fn the_dictionary_names_the_magic_every_type_and_every_flag() {
    let dict = std::fs::read_to_string(proto_dir().join("fuzz/decode.dict")).expect("decode.dict");
    assert!(dict.contains("\"FX\\x01\""), "the magic and version");
    for t in felix_proto::FrameType::ALL {
        let header_start = format!("\"FX\\x01\\x{:02x}\"", t as u8);
        assert!(dict.contains(&header_start), "{t:?}: {header_start}");
    }
    for flags in ["\"\\x00\\x01\"", "\"\\x00\\x02\"", "\"\\x00\\x03\""] {
        assert!(dict.contains(flags), "flags {flags}");
    }
}
