//! The metrics of a run as TensorBoard event files (trainer/src/tensorboard.rs) and as a PNG of every
//! metric (trainer/src/plot.rs): the event file parses back with rlx's reader and with the official
//! `tensorboard` package (`tensorboard_reader.py`, in the torch environment of
//! scripts/install-torch.sh); corrupt or truncated files are errors, never panics; the plot has one
//! panel per metric and grows in height with its rows.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlx_trainer::plot::{self, Panel};
use rlx_trainer::tensorboard::{self, EventWriter};
use serde_json::{json, Map, Value};

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tensorboard")
        .join(format!("{name}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn line(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Three metrics lines as the trainer writes them: numbers, a null, strings, a boolean, a nested
/// object, a key on some steps only.
fn history() -> Vec<Map<String, Value>> {
    vec![
        line(json!({
            "step": 0, "reward/mean": 0.25, "loss": -1.5, "kl": null,
            "skipped": "no kept group", "time/sample_s": 3, "done": true,
            "signals": {"score": 1.0}, "list": [1, 2],
        })),
        line(json!({"step": 1, "reward/mean": 0.5, "loss": -0.75, "kl": 0.001})),
        line(
            json!({"step": 2, "reward/mean": 1e-3, "eval/accuracy": 0.875, "grad_norm": 12345.678}),
        ),
    ]
}

/// What the event file of `history()` holds, sorted: (step, tag, value as f32).
fn expected() -> Vec<(i64, String, f32)> {
    let mut scalars: Vec<(i64, String, f32)> = [
        (0, "reward/mean", 0.25),
        (0, "loss", -1.5),
        (0, "time/sample_s", 3.0),
        (1, "reward/mean", 0.5),
        (1, "loss", -0.75),
        (1, "kl", 0.001),
        (2, "reward/mean", 1e-3),
        (2, "eval/accuracy", 0.875),
        (2, "grad_norm", 12345.678),
    ]
    .into_iter()
    .map(|(s, t, v)| (s, t.to_string(), v as f32))
    .collect();
    scalars.sort_by(|a, b| a.partial_cmp(b).unwrap());
    scalars
}

fn sorted(mut scalars: Vec<(i64, String, f32)>) -> Vec<(i64, String, f32)> {
    scalars.sort_by(|a, b| a.partial_cmp(b).unwrap());
    scalars
}

/// The event file of `history()`: the first line as the history of `create`, the others appended.
fn write_run(out: &Path) -> PathBuf {
    let lines = history();
    let mut writer = EventWriter::create(out, &lines[..1]).unwrap();
    for line in &lines[1..] {
        writer.write_line(line).unwrap();
    }
    writer.path().to_path_buf()
}

#[test]
fn the_event_file_parses_back_with_its_steps_tags_and_values() {
    let out = tmp("round-trip");
    let path = write_run(&out);
    assert_eq!(path, out.join("tensorboard").join(tensorboard::FILE));
    assert_eq!(path, tensorboard::file_path(&out));
    assert!(tensorboard::FILE.contains("tfevents"));
    let scalars = tensorboard::read_scalars(&path).unwrap();
    // Nulls, strings, booleans, arrays and objects are skipped; "step" is no scalar.
    assert_eq!(sorted(scalars.clone()), expected());
    // File order: step by step.
    let steps: Vec<i64> = scalars.iter().map(|s| s.0).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    // Appending more (as the training loop does) extends the same file.
    let mut writer = EventWriter::create(&out, &history()).unwrap();
    writer
        .write_line(&line(json!({"step": 3, "reward/mean": 2})))
        .unwrap();
    let mut more = expected();
    more.push((3, "reward/mean".into(), 2.0));
    assert_eq!(sorted(tensorboard::read_scalars(&path).unwrap()), more);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_second_create_replaces_the_file_with_its_history() {
    let out = tmp("replace");
    let path = write_run(&out);
    // A resume from step 1: the lines kept are step 0's only.
    let history = history();
    let mut writer = EventWriter::create(&out, &history[..1]).unwrap();
    let kept = sorted(tensorboard::read_scalars(&path).unwrap());
    assert_eq!(
        kept,
        sorted(vec![
            (0, "reward/mean".into(), 0.25),
            (0, "loss".into(), -1.5),
            (0, "time/sample_s".into(), 3.0),
        ])
    );
    writer
        .write_line(&line(json!({"step": 1, "loss": 4.0})))
        .unwrap();
    assert_eq!(
        tensorboard::read_scalars(&path).unwrap().last(),
        Some(&(1, "loss".to_string(), 4.0))
    );
    // One event file in the directory, not one per start.
    let files: Vec<_> = std::fs::read_dir(out.join(tensorboard::DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files, vec![std::ffi::OsString::from(tensorboard::FILE)]);
    // An empty history: the file version alone, no scalar.
    EventWriter::create(&out, &[]).unwrap();
    assert_eq!(tensorboard::read_scalars(&path).unwrap(), vec![]);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_line_without_a_valid_step_is_an_error_naming_it() {
    let out = tmp("steps");
    let mut writer = EventWriter::create(&out, &[]).unwrap();
    let path = writer.path().display().to_string();
    for bad in [
        json!({"loss": 1.0}),
        json!({"step": -1, "loss": 1.0}),
        json!({"step": 1.5, "loss": 1.0}),
        json!({"step": "3", "loss": 1.0}),
        json!({"step": null, "loss": 1.0}),
    ] {
        let error = writer.write_line(&line(bad.clone())).unwrap_err();
        assert!(error.contains("\"step\""), "{bad}: {error}");
        assert!(error.contains(&path), "{bad}: {error}");
        if let Some(step) = bad.get("step") {
            assert!(error.contains(&step.to_string()), "{bad}: {error}");
        }
    }
    // In a history too.
    let error = EventWriter::create(&out, &[line(json!({"step": -2, "loss": 0}))])
        .err()
        .unwrap();
    assert!(error.contains("-2"), "{error}");
    // A whole float is a step.
    let mut writer = EventWriter::create(&out, &[]).unwrap();
    writer
        .write_line(&line(json!({"step": 4.0, "loss": 1.0})))
        .unwrap();
    assert_eq!(
        tensorboard::read_scalars(writer.path()).unwrap(),
        vec![(4, "loss".to_string(), 1.0)]
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_unwritable_directory_is_an_error_naming_it() {
    let out = tmp("unwritable");
    // OUT/tensorboard exists as a file.
    std::fs::write(out.join(tensorboard::DIR), "").unwrap();
    let error = EventWriter::create(&out, &history()).err().unwrap();
    assert!(error.starts_with("cannot write "), "{error}");
    assert!(error.contains(tensorboard::DIR), "{error}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The byte offsets at which the records of an event file end.
fn record_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let length = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        at += 12 + length + 4;
        ends.push(at);
    }
    assert_eq!(at, bytes.len());
    ends
}

/// A TFRecord of `data` with correct checksums.
fn frame(data: &[u8], length: u64) -> Vec<u8> {
    let mut out = length.to_le_bytes().to_vec();
    out.extend(tensorboard::masked_crc(&length.to_le_bytes()).to_le_bytes());
    out.extend(data);
    out.extend(tensorboard::masked_crc(data).to_le_bytes());
    out
}

#[test]
fn truncated_or_corrupt_files_are_errors_never_panics() {
    let out = tmp("corrupt");
    let path = write_run(&out);
    let bytes = std::fs::read(&path).unwrap();
    let ends = record_ends(&bytes);
    assert_eq!(ends.len(), 4, "the file version and three events");
    let bad = out.join("bad.tfevents");
    // Cut anywhere: an error unless the cut falls between two records (then a shorter valid file).
    for cut in 0..bytes.len() {
        std::fs::write(&bad, &bytes[..cut]).unwrap();
        let read = tensorboard::read_scalars(&bad);
        if ends.contains(&cut) {
            assert!(read.is_ok(), "cut at {cut}: {read:?}");
        } else {
            let error = read.unwrap_err();
            assert!(error.contains(&bad.display().to_string()), "{error}");
            assert!(
                error.contains("truncated") || error.contains("empty"),
                "cut at {cut}: {error}"
            );
        }
    }
    // Any byte changed anywhere: a checksum catches it.
    for at in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= flip;
            std::fs::write(&bad, &corrupt).unwrap();
            let error = tensorboard::read_scalars(&bad).unwrap_err();
            assert!(
                error.contains("checksum")
                    || error.contains("truncated")
                    || error.contains("limit"),
                "byte {at} ^ {flip:#x}: {error}"
            );
        }
    }
    // A record longer than the limit, with a valid length checksum: refused before reading it.
    let huge = frame(b"", tensorboard::MAX_RECORD + 1);
    std::fs::write(&bad, [&bytes[..ends[0]], &huge[..12]].concat()).unwrap();
    let error = tensorboard::read_scalars(&bad).unwrap_err();
    assert!(error.contains("over the limit"), "{error}");
    assert!(error.contains("record 1 at byte"), "{error}");
    // A length within the limit but past the end of the file.
    let long = frame(b"", 1000);
    std::fs::write(&bad, [&bytes[..ends[0]], &long[..12], &[0; 10]].concat()).unwrap();
    let error = tensorboard::read_scalars(&bad).unwrap_err();
    assert!(error.contains("truncated"), "{error}");
    // Valid checksums around a malformed message.
    for data in [
        &[0xff, 0xff, 0xff][..],                   // a truncated varint
        &[0x2a, 0x05, 0x0a][..],                   // a summary longer than the event
        &[0x0b][..],                               // wire type 3 (groups)
        &[0x09, 0, 0][..],                         // a truncated double
        &[0x2a, 0x03, 0x0a, 0x01, 0xff][..],       // a value that is not a message
        &[0x2a, 0x04, 0x0a, 0x02, 0x0a, 0x01][..], // a tag past the value
        &[0x10; 1][..],                            // a step with no varint
    ] {
        std::fs::write(
            &bad,
            [&bytes[..ends[0]], &frame(data, data.len() as u64)].concat(),
        )
        .unwrap();
        let error = tensorboard::read_scalars(&bad).unwrap_err();
        assert!(error.contains("malformed"), "{data:?}: {error}");
    }
    // A tag that is not UTF-8.
    let data = [0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 0xff, 0x15, 0, 0, 0, 0];
    std::fs::write(&bad, [&bytes[..ends[0]], &frame(&data, 12)].concat()).unwrap();
    let error = tensorboard::read_scalars(&bad).unwrap_err();
    assert!(error.contains("not UTF-8"), "{error}");
    // A TFRecord file whose first record is no file version: not an event file.
    std::fs::write(&bad, &bytes[ends[0]..]).unwrap();
    let error = tensorboard::read_scalars(&bad).unwrap_err();
    assert!(error.contains("not an event file"), "{error}");
    // Random bytes, and no file at all.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(&bad, &random).unwrap();
    assert!(tensorboard::read_scalars(&bad).is_err());
    let missing = out.join("missing.tfevents");
    let error = tensorboard::read_scalars(&missing).unwrap_err();
    assert!(
        error.starts_with(&format!("cannot read {}", missing.display())),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// `tensorboard_reader.py MODE PATH` in the torch environment: its JSON, or its error output.
fn tensorboard_reader(mode: &str, path: &Path) -> Result<Value, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorboard_reader.py");
    let output = Command::new(rlx_tools::python())
        .arg(script)
        .arg(mode)
        .arg(path)
        .output()
        .expect("run the torch environment's python (scripts/install-torch.sh)");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        !stderr.contains("ModuleNotFoundError"),
        "the tensorboard package is missing: run scripts/install-torch.sh\n{stderr}"
    );
    if !output.status.success() {
        return Err(stderr);
    }
    Ok(serde_json::from_slice(&output.stdout).unwrap())
}

fn as_scalars(rows: &Value) -> Vec<(i64, String, f32)> {
    sorted(
        rows.as_array()
            .unwrap()
            .iter()
            .map(|row| {
                (
                    row[0].as_i64().unwrap(),
                    row[1].as_str().unwrap().to_string(),
                    row[2].as_f64().unwrap() as f32,
                )
            })
            .collect(),
    )
}

#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn the_tensorboard_package_reads_the_event_file() {
    let out = tmp("tensorboard-package");
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let path = write_run(&out);
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // TensorBoard's own loader of a run directory.
    let run = tensorboard_reader("accumulate", &out.join(tensorboard::DIR)).unwrap();
    assert_eq!(run["file_version"], 2.0, "{run}");
    assert_eq!(as_scalars(&run["scalars"]), expected());
    // Record by record, every checksum verified: the file version first, wall times of now.
    let events = tensorboard_reader("records", &path).unwrap();
    let events = events.as_array().unwrap();
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[0]["file_version"], tensorboard::FILE_VERSION);
    for event in events {
        let wall = event["wall_time"].as_f64().unwrap();
        assert!(start - 1.0 <= wall && wall <= end + 1.0, "{event}");
    }
    let scalars: Vec<Value> = events
        .iter()
        .flat_map(|e| {
            e["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| json!([e["step"], v[0], v[1]]))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(as_scalars(&Value::Array(scalars)), expected());
    // What rlx's reader rejects, TensorBoard's rejects too: one byte changed in the last record.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 6;
    bytes[at] ^= 0x40;
    let bad = out.join("bad.tfevents");
    std::fs::write(&bad, &bytes).unwrap();
    assert!(tensorboard::read_scalars(&bad)
        .unwrap_err()
        .contains("checksum"));
    let error = tensorboard_reader("records", &bad).unwrap_err();
    assert!(error.contains("crc32"), "{error}");
    let _ = std::fs::remove_dir_all(&out);
}

fn points(panel: &Panel) -> &[(f64, f64)] {
    assert_eq!(panel.series.len(), 1, "{}", panel.title);
    &panel.series[0].2
}

#[test]
fn metric_panels_has_one_panel_per_metric_at_steps_done() {
    let mut history = history();
    history.push(line(json!({
        "step": 3, "time/train_s": 2.5, "sample_tokens_per_s": 900.0, "recipe/kl": 0.01,
        "signal/correctness/mean": 0.5, "accuracy": 0.75, "step_time_s": 9.0,
    })));
    let before = line(json!({"eval/accuracy": 0.5, "note": "warm start", "eval/n": null}));
    let panels = plot::metric_panels(&history, &before);
    let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
    assert_eq!(
        titles,
        [
            "reward/mean",
            "loss",
            "recipe/kl",
            "signal/correctness/mean",
            "eval/accuracy",
            "accuracy",
            "grad_norm",
            "kl",
            "sample_tokens_per_s",
            "step_time_s",
            "time/sample_s",
            "time/train_s",
        ]
    );
    let panel = |title: &str| panels.iter().find(|p| p.title == title).unwrap();
    // Step k at x = k + 1; `before` at x = 0; nulls and strings are no points.
    assert_eq!(
        points(panel("reward/mean")),
        [(1.0, 0.25), (2.0, 0.5), (3.0, 1e-3)]
    );
    assert_eq!(points(panel("eval/accuracy")), [(0.0, 0.5), (3.0, 0.875)]);
    assert_eq!(points(panel("kl")), [(2.0, 0.001)]);
    assert_eq!(points(panel("time/train_s")), [(4.0, 2.5)]);
    assert_eq!(panel("loss").series[0].0, "loss");
    // No history: the evaluation before the first step alone.
    let panels = plot::metric_panels(&[], &before);
    assert_eq!(panels.len(), 1);
    assert_eq!(points(&panels[0]), [(0.0, 0.5)]);
    assert!(plot::metric_panels(&[], &Map::new()).is_empty());
}

/// (width, height) from a PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&bytes[12..16], b"IHDR");
    (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    )
}

#[test]
fn the_png_grows_in_height_with_the_rows_of_panels() {
    let out = tmp("png");
    let curve: Vec<(f64, f64)> = (0..30)
        .map(|i| (i as f64, (i as f64 * 0.3).sin()))
        .collect();
    let panel = |k: usize| Panel {
        title: format!("signal/a_rather_long_signal_name_{k}/mean"),
        series: vec![(format!("s{k}"), plot::COLORS[k % 4], curve.clone())],
        bands: Vec::new(),
    };
    let mut heights = Vec::new();
    for (n, rows) in [(1, 1), (4, 2), (13, 5)] {
        let path = out.join(format!("panels-{n}.png"));
        let panels: Vec<Panel> = (0..n).map(panel).collect();
        plot::write_png(&path, "rlx run: grpo, run test", &panels).unwrap();
        let (width, height) = png_size(&path);
        assert_eq!(width, plot::WIDTH, "{n} panels");
        assert_eq!(height, plot::HEADER + rows * plot::ROW_HEIGHT, "{n} panels");
        assert_eq!(height, plot::height(n), "{n} panels");
        heights.push(height);
    }
    assert!(heights.windows(2).all(|w| w[0] < w[1]), "{heights:?}");
    // Four panels keep the former 2×2 figure's size.
    assert_eq!(plot::height(4), plot::HEIGHT);
    // The panels of a real history, a long title, and no panel at all.
    let path = out.join("metrics.png");
    let panels = plot::metric_panels(&history(), &line(json!({"eval/accuracy": 0.25})));
    let title = "rlx run: ".to_string() + &"a very long recipe and run name ".repeat(6);
    plot::write_png(&path, &title, &panels).unwrap();
    assert_eq!(png_size(&path), (plot::WIDTH, plot::height(panels.len())));
    plot::write_png(&path, "empty", &[]).unwrap();
    assert_eq!(
        png_size(&path),
        (plot::WIDTH, plot::HEADER + plot::ROW_HEIGHT)
    );
    // An unwritable path is an error naming it.
    let error = plot::write_png(&out.join("missing").join("x.png"), "t", &panels).unwrap_err();
    assert!(error.contains("missing"), "{error}");
    let _ = std::fs::remove_dir_all(&out);
}
