import CTPMSoftwareStack

/// The TPM Software Stack (tpm2-tss), loaded when a TPM operation first needs it, as systemd
/// loads it: nothing of it is needed to build or to start, only to use a TPM.
///
/// ```swift
/// if let reason = TPMSoftwareStack.unavailableReason { print("no TPM support: \(reason)") }
/// ```
package enum TPMSoftwareStack {
    /// The shared libraries loaded, by soname.
    package static let libraries = ["libtss2-esys.so.0", "libtss2-tctildr.so.0", "libtss2-rc.so.0"]
    /// The Debian packages that provide them.
    package static let debianPackages = ["libtss2-esys-3.0.2-0", "libtss2-tctildr0", "libtss2-rc0"]

    /// `nil` once the stack is loaded (`dlopen` of ``libraries``, `dlsym` of every function the
    /// binding calls); otherwise the loader's reason. Loaded once per process.
    package static var unavailableReason: String? {
        dp_tss2_load().map { String(cString: $0) }
    }

    /// Whether TPM operations can run in this process.
    package static var isAvailable: Bool { unavailableReason == nil }

    /// Loads the stack, or throws ``TPMError/Kind/softwareStackMissing`` saying what is missing.
    static func load() throws {
        guard let reason = TPMBinding.unsupportedReason else { return }
        throw TPMError(kind: .softwareStackMissing, call: "dlopen(\(libraries[0]))", code: 0, reason: reason)
    }
}
