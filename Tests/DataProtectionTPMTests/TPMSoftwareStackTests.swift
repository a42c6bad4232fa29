import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// The TPM Software Stack is loaded at run time (FORMAT.md §2c, README "TPM"): nothing of it is
/// needed to build or start, and without it the TPM commands say what is missing.
@Suite struct TPMSoftwareStackTests {
    /// The executables the README runs: none may need a TPM library to start.
    static let executables = ["dpctl", "keybagd"]

    @Test func noExecutableLinksTheStack() throws {
        for name in Self.executables {
            let path = CLI.executable.deletingLastPathComponent().appendingPathComponent(name).path
            let dynamic = try ChildProcess.run("readelf", ["--dynamic", path])
            #expect(dynamic.status == 0, "\(dynamic.err)")
            #expect(dynamic.out.contains("(NEEDED)"), "readelf printed no needed library for \(name)")
            #expect(!dynamic.out.contains("tss2"), "\(name) links the TPM Software Stack:\n\(dynamic.out)")
        }
    }

    /// Our declarations (Sources/CTPMSoftwareStack) against the stack's own headers (Debian
    /// libtss2-dev, which scripts/test installs): every size, offset and constant the binding uses.
    @Test func theDeclarationsMatchTheStacksHeaders() throws {
        try #require(FileManager.default.fileExists(atPath: "/usr/include/tss2/tss2_esys.h"),
                     "the stack's headers are missing: apt-get install libtss2-dev (scripts/test installs it)")
        let work = temporaryDirectory()
        let program = work.appendingPathComponent("layout.c")
        try Self.layoutProgram.write(to: program, atomically: true, encoding: .utf8)
        let ours = packageRoot.appendingPathComponent("Sources/CTPMSoftwareStack/include").path
        var outputs: [String] = []
        for (name, flags) in [("theirs", ["-DTHEIRS"]), ("ours", ["-I", ours])] {
            let binary = work.appendingPathComponent(name).path
            let compiled = try ChildProcess.run("cc", flags + ["-Wall", "-Werror", "-o", binary, program.path])
            try #require(compiled.status == 0, "cc (\(name)): \(compiled.err)")
            let run = try ChildProcess.run(binary, [])
            try #require(run.status == 0)
            outputs.append(run.out)
        }
        let theirs = outputs[0].split(separator: "\n"), ours_ = outputs[1].split(separator: "\n")
        #expect(theirs.count == ours_.count && theirs.count > 90)
        for (a, b) in zip(theirs, ours_) { #expect(a == b) }
    }

    /// Without the stack's libraries (each one hidden in turn from a real `dpctl` by a bubblewrap
    /// bind of an empty file), TPM commands fail with one line naming what to install, exit 1,
    /// and leave nothing; everything else works, and `status` says TPM support is not available.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap") && getuid() == 0))
    func withoutTheStackTPMCommandsSayWhatIsMissing() throws {
        let tpm = try SoftwareTPM()
        let sealed = CLI.make()
        let passcode = sealed.writeFile("passcode", "123456\n")
        let made = try sealed.run(["init", "--tpm", "--passcode-file", passcode], environment: tpm.environment)
        try #require(made.status == 0, "\(made.stderr)")

        for library in TPMSoftwareStack.libraries {
            let path = try Self.resolvedPath(of: library)
            let cli = CLI.make()
            /// `dpctl --root ROOT args…` under bubblewrap, with the library replaced by an empty file.
            func hidden(_ cli: CLI, _ args: [String], _ environment: [String: String] = [:]) throws -> CLI.Result {
                let run = try ChildProcess.run("bwrap", ["--dev-bind", "/", "/", "--ro-bind", "/dev/null", path, "--",
                                                         CLI.executable.path, "--root", cli.root] + args, environment: environment)
                return CLI.Result(status: run.status, stdout: Data(run.out.utf8), stderr: run.err)
            }

            let refused = try hidden(cli, ["init", "--tpm", "--passcode-file", passcode], tpm.environment)
            #expect(refused.status == 1)
            #expect(refused.stderr.hasPrefix("dpctl: ") && refused.stderr.split(separator: "\n").count == 1, "\(refused.stderr)")
            #expect(refused.stderr.contains("the TPM Software Stack is not installed"))
            #expect(refused.stderr.contains("libtss2-esys-3.0.2-0, libtss2-tctildr0, libtss2-rc0"))
            #expect(!FileManager.default.fileExists(atPath: cli.root + "/keybag"), "init --tpm left a keybag")

            // A device sealed by a TPM cannot open without the stack: the same one line.
            let opened = try hidden(sealed, ["status"], tpm.environment)
            #expect(opened.status == 1)
            #expect(opened.stderr.contains("the TPM Software Stack is not installed") && opened.stderr.split(separator: "\n").count == 1)

            // Everything else works, and says TPM support is missing.
            let plain = try hidden(cli, ["init", "--passcode-file", passcode])
            #expect(plain.status == 0, "\(plain.stderr)")
            let status = try hidden(cli, ["status"])
            #expect(status.status == 0)
            #expect(status.out.contains("TPM support:      not available: the TPM Software Stack is not installed"))
            let json = try #require(try JSONSerialization.jsonObject(with: try hidden(cli, ["status", "--json"]).stdout) as? [String: Any])
            #expect((json["tpmSupport"] as? [String: Any])?["available"] as? Bool == false)
            let enroll = try hidden(cli, ["tpm", "enroll", "--passcode-file", passcode], tpm.environment)
            #expect(enroll.status == 1 && enroll.stderr.contains("the TPM Software Stack is not installed"), "\(enroll.stderr)")
        }

        // With the stack, the same binary says it is available and opens the sealed device.
        let status = try sealed.run(["status"], environment: tpm.environment)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.out.contains("TPM support:      available"))
    }

    /// Where the dynamic loader finds `soname` (`ldconfig -p`), links resolved.
    static func resolvedPath(of soname: String) throws -> String {
        let cache = try ChildProcess.run("/sbin/ldconfig", ["-p"])
        let line = try #require(cache.out.split(separator: "\n").first { $0.contains(soname + " (") },
                                "\(soname) is not installed")
        let path = String(try #require(line.components(separatedBy: " => ").last)).trimmingCharacters(in: .whitespaces)
        return URL(fileURLWithPath: path).resolvingSymlinksInPath().path
    }

    /// Prints the size of each type, the offset of each field and the value of each constant the
    /// binding uses, from whichever header it was compiled with.
    static let layoutProgram = """
        #include <stdio.h>
        #include <stddef.h>
        #ifdef THEIRS
        #include <tss2/tss2_esys.h>
        #include <tss2/tss2_tctildr.h>
        #include <tss2/tss2_rc.h>
        #else
        #include "CTPMSoftwareStack.h"
        #endif
        #define SIZE(T) printf("sizeof %s %zu align %zu\\n", #T, sizeof(T), _Alignof(T));
        #define OFFSET(T, f) printf("offsetof %s.%s %zu\\n", #T, #f, offsetof(T, f));
        #define VALUE(c) printf("value %s %llu\\n", #c, (unsigned long long)(c));
        int main(void) {
            SIZE(TSS2_RC) SIZE(ESYS_TR) SIZE(TPM2_ALG_ID) SIZE(TPM2_SE) SIZE(TPM2_CAP) SIZE(TPM2_PT) SIZE(TPM2_HANDLE) SIZE(TPM2_NT)
            SIZE(TPMA_OBJECT) SIZE(TPMA_SESSION) SIZE(TPMA_PERMANENT) SIZE(TPMA_NV) SIZE(TPMI_YES_NO) SIZE(TPMI_DH_PERSISTENT)
            SIZE(TSS2_ABI_VERSION)
            SIZE(TPM2B_DIGEST) SIZE(TPM2B_AUTH) SIZE(TPM2B_NONCE) SIZE(TPM2B_DATA) SIZE(TPM2B_SENSITIVE_DATA) SIZE(TPM2B_MAX_NV_BUFFER)
            SIZE(TPMU_SYM_KEY_BITS) SIZE(TPMU_SYM_MODE) SIZE(TPMT_SYM_DEF) SIZE(TPMT_SYM_DEF_OBJECT)
            OFFSET(TPMT_SYM_DEF, keyBits) OFFSET(TPMT_SYM_DEF, mode) OFFSET(TPMT_SYM_DEF_OBJECT, keyBits) OFFSET(TPMT_SYM_DEF_OBJECT, mode)
            SIZE(TPMT_KEYEDHASH_SCHEME) OFFSET(TPMT_KEYEDHASH_SCHEME, details)
            SIZE(TPMU_ASYM_SCHEME) SIZE(TPMT_ECC_SCHEME) SIZE(TPMT_RSA_SCHEME) SIZE(TPMT_ASYM_SCHEME) SIZE(TPMT_KDF_SCHEME)
            SIZE(TPMS_KEYEDHASH_PARMS) SIZE(TPMS_SYMCIPHER_PARMS) SIZE(TPMS_RSA_PARMS) SIZE(TPMS_ECC_PARMS) SIZE(TPMS_ASYM_PARMS)
            OFFSET(TPMS_ECC_PARMS, symmetric) OFFSET(TPMS_ECC_PARMS, scheme) OFFSET(TPMS_ECC_PARMS, curveID) OFFSET(TPMS_ECC_PARMS, kdf)
            OFFSET(TPMS_RSA_PARMS, scheme) OFFSET(TPMS_RSA_PARMS, keyBits) OFFSET(TPMS_RSA_PARMS, exponent)
            SIZE(TPMU_PUBLIC_PARMS) SIZE(TPMU_PUBLIC_ID) SIZE(TPMS_ECC_POINT) SIZE(TPM2B_ECC_PARAMETER) SIZE(TPM2B_PUBLIC_KEY_RSA)
            SIZE(TPMT_PUBLIC) OFFSET(TPMT_PUBLIC, type) OFFSET(TPMT_PUBLIC, nameAlg) OFFSET(TPMT_PUBLIC, objectAttributes)
            OFFSET(TPMT_PUBLIC, authPolicy) OFFSET(TPMT_PUBLIC, parameters) OFFSET(TPMT_PUBLIC, unique)
            SIZE(TPM2B_PUBLIC) OFFSET(TPM2B_PUBLIC, publicArea)
            SIZE(TPMS_SENSITIVE_CREATE) OFFSET(TPMS_SENSITIVE_CREATE, data) SIZE(TPM2B_SENSITIVE_CREATE) OFFSET(TPM2B_SENSITIVE_CREATE, sensitive)
            SIZE(TPMS_PCR_SELECTION) OFFSET(TPMS_PCR_SELECTION, sizeofSelect) OFFSET(TPMS_PCR_SELECTION, pcrSelect)
            SIZE(TPML_PCR_SELECTION) OFFSET(TPML_PCR_SELECTION, pcrSelections)
            SIZE(TPMS_NV_PUBLIC) OFFSET(TPMS_NV_PUBLIC, nameAlg) OFFSET(TPMS_NV_PUBLIC, attributes) OFFSET(TPMS_NV_PUBLIC, authPolicy)
            OFFSET(TPMS_NV_PUBLIC, dataSize) SIZE(TPM2B_NV_PUBLIC) OFFSET(TPM2B_NV_PUBLIC, nvPublic)
            SIZE(TPML_HANDLE) OFFSET(TPML_HANDLE, handle) SIZE(TPMS_TAGGED_PROPERTY) OFFSET(TPMS_TAGGED_PROPERTY, value)
            SIZE(TPML_TAGGED_TPM_PROPERTY) OFFSET(TPML_TAGGED_TPM_PROPERTY, tpmProperty)
            SIZE(TPMU_CAPABILITIES) SIZE(TPMS_CAPABILITY_DATA) OFFSET(TPMS_CAPABILITY_DATA, data)
            VALUE(TSS2_RC_SUCCESS) VALUE(ESYS_TR_NONE) VALUE(ESYS_TR_PASSWORD) VALUE(ESYS_TR_RH_OWNER) VALUE(ESYS_TR_RH_LOCKOUT)
            VALUE(TPM2_ALG_AES) VALUE(TPM2_ALG_KEYEDHASH) VALUE(TPM2_ALG_SHA256) VALUE(TPM2_ALG_NULL) VALUE(TPM2_ALG_ECC) VALUE(TPM2_ALG_CFB)
            VALUE(TPM2_ECC_NIST_P256) VALUE(TPM2_SE_HMAC) VALUE(TPM2_SE_POLICY) VALUE(TPM2_SE_TRIAL)
            VALUE(TPM2_CAP_HANDLES) VALUE(TPM2_CAP_TPM_PROPERTIES)
            VALUE(TPMA_OBJECT_FIXEDTPM) VALUE(TPMA_OBJECT_FIXEDPARENT) VALUE(TPMA_OBJECT_SENSITIVEDATAORIGIN) VALUE(TPMA_OBJECT_USERWITHAUTH)
            VALUE(TPMA_OBJECT_NODA) VALUE(TPMA_OBJECT_RESTRICTED) VALUE(TPMA_OBJECT_DECRYPT)
            VALUE(TPMA_SESSION_CONTINUESESSION) VALUE(TPMA_SESSION_DECRYPT) VALUE(TPMA_SESSION_ENCRYPT)
            VALUE(TPMA_PERMANENT_LOCKOUTAUTHSET) VALUE(TPMA_PERMANENT_INLOCKOUT)
            VALUE(TPM2_NT_ORDINARY) VALUE(TPM2_NT_COUNTER) VALUE(TPMA_NV_TPM2_NT_SHIFT) VALUE(TPMA_NV_AUTHWRITE) VALUE(TPMA_NV_AUTHREAD) VALUE(TPMA_NV_NO_DA)
            return 0;
        }
        """
}
