fn main() {
    let args: Vec<String> = std::env::args().collect();
    let wit = heddle_package_build::wit_in(std::path::Path::new(&args[1])).unwrap();
    heddle_package_build::generate_c_bindings(&wit, std::path::Path::new(&args[2])).unwrap();
}
