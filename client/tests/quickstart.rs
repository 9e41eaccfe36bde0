//! The documented example runs against the test broker, and docs/client.md holds it verbatim.

mod support;

#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use support::{BrokerOptions, TestBroker};

#[tokio::test]
async fn the_quickstart_runs() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    quickstart::run(broker.client_config()).await.unwrap();
    quickstart::run(broker.client_config()).await.unwrap();
    let o = broker.state.lock();
    assert_eq!(o.streams["acme/shop/orders"].shards.iter().map(Vec::len).sum::<usize>(), 8);
    assert!(!o.commits.is_empty(), "the group committed");
    drop(o);
    assert_eq!(quickstart::trust_in_code().unwrap().len(), 2);
    broker.assert_no_unadvertised_bits();
}

#[test]
fn docs_client_md_holds_the_example_verbatim() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("../docs/client.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/quickstart.rs")).unwrap();
    assert!(doc.contains(example.trim()), "docs/client.md is out of date with the example");
}
