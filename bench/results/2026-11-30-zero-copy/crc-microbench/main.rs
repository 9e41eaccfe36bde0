use std::time::Instant;
fn cpu() -> f64 { let mut t = libc_time(); t }
fn libc_time() -> f64 { let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap(); let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect(); (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0 }
fn main() {
    let src: Vec<u8> = (0..64 * 4200).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; 64 * 4200];
    let iters = 4000;
    for mode in 0..4 {
        let c0 = cpu(); let t0 = Instant::now();
        let mut acc = 0u32;
        for _ in 0..iters {
            let mut crc = 0u32; let mut at = 0; let mut from = 0;
            for _r in 0..64 {
                let start = at;
                dst[at..at + 22].copy_from_slice(&src[at..at + 22]); at += 22;
                if mode == 1 { crc = crc32c::crc32c_append(crc, &dst[start..at]); }
                for _p in 0..4 {
                    let n = 1024;
                    dst[at..at + n].copy_from_slice(&src[at..at + n]);
                    if mode == 1 { crc = crc32c::crc32c_append(crc, &dst[at..at + n]); }
                    at += n;
                }
                if mode == 2 { crc = crc32c::crc32c_append(crc, &dst[start..at]); }
                if mode == 3 && at - from >= 16384 { crc = crc32c::crc32c_append(crc, &dst[from..at]); from = at; }
            }
            if mode == 0 { crc = crc32c::crc32c_append(crc, &dst[..at]); }
            if mode == 3 { crc = crc32c::crc32c_append(crc, &dst[from..at]); }
            acc ^= crc;
        }
        let mb = (iters * 64 * 4118) as f64 / 1e6;
        println!("mode {mode} ({}): {:.0} MB/s wall, {:.0} MB/cpu-s, acc {acc}", ["copy all then one crc", "crc per part", "crc per record", "crc per 16 KiB span"][mode], mb / t0.elapsed().as_secs_f64(), mb / (cpu() - c0));
    }
}
