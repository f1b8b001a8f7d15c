fn main() {
    let out = std::env::var("OUT_DIR").unwrap();
    println!("cargo:rustc-env=HEDDLE_FIRST_PARTY_DIR={out}/packages");
}
