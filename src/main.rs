fn main() {
    println!("heddle {}", env!("CARGO_PKG_VERSION"));
}
