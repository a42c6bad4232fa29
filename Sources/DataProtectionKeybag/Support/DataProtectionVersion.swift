/// The version of this package, which `dpctl --version`, `keybagd --version` and
/// `dp-bench --version` print.
public enum DataProtectionVersion {
    public static let string = "0.10.0"
}
