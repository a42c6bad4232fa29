import DataProtectionTestSupport
import Foundation
import Testing

/// `dpctl sql` and `dpctl sql-key`, as a user runs them.
@Suite struct SQLCommandTests {
    @Test func classManagedSQLCipherAndPlainDatabases() throws {
        let cli = CLI.make()
        let passcode = cli.file("pc")
        try "123456\n".write(toFile: passcode, atomically: true, encoding: .utf8)
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)

        // Class-managed: created with --class, found by its key file afterwards.
        let notes = cli.file("notes.db")
        let made = try cli.run(["sql", notes, "--class", "A", "--passcode-file", passcode,
                                "CREATE TABLE note(id INTEGER PRIMARY KEY, t TEXT, r REAL); INSERT INTO note(t, r) VALUES ('hi', 1), (NULL, 0.5), ('a\tb', 1e20); SELECT * FROM note"])
        #expect(made.status == 0, "\(made.stderr)")
        #expect(made.out == "1\thi\t1.0\n2\t\t0.5\n3\ta\\tb\t1.0e+20\n")
        let locked = try cli.run(["sql", notes, "SELECT count(*) FROM note"])
        #expect(locked.status == 3)
        #expect(locked.stderr.hasPrefix("dpctl: \(notes): class A"), "\(locked.stderr)")
        #expect(try cli.run(["sql-key", notes]).status == 3)
        let key = try cli.run(["sql-key", notes, "--passcode-file", passcode]).out.trimmingCharacters(in: .newlines)
        #expect(key.count == 64)
        // The raw key opens it as an SQLCipher database.
        #expect(try cli.run(["sql", notes, "--raw-key-hex", key, "SELECT count(*) FROM note"]).out == "3\n")

        // SQLCipher with a passphrase, both formats; a wrong passphrase exits 5.
        let phrase = cli.file("phrase")
        try "open sesame\n".write(toFile: phrase, atomically: true, encoding: .utf8)
        for compat in ["3", "4"] {
            let db = cli.file("p\(compat).db")
            #expect(try cli.run(["sql", db, "--passphrase-file", phrase, "--cipher-compat", compat, "CREATE TABLE t(x); INSERT INTO t VALUES (7)"]).status == 0)
            #expect(try cli.run(["sql", db, "--passphrase-file", phrase, "--cipher-compat", compat, "SELECT x FROM t"]).out == "7\n")
            let wrong = try cli.run(["sql", db, "--passphrase-file", passcode, "--cipher-compat", compat, "SELECT x FROM t"])
            #expect(wrong.status == 5)
            #expect(wrong.stderr.contains("wrong key"))
        }

        // Plain SQLite without any key; SQL errors are one line.
        let plain = cli.file("plain.db")
        #expect(try cli.run(["sql", plain, "CREATE TABLE t(x); INSERT INTO t VALUES (42); SELECT x FROM t"]).out == "42\n")
        let error = try cli.run(["sql", plain, "SELECT * FROM nope"])
        #expect(error.status == 1)
        #expect(error.stderr.contains("no such table: nope"))
        #expect(try cli.run(["sql", plain, "--class", "A", "--raw-key-hex", key, "SELECT 1"]).status != 0)
    }

    @Test func sqlFromStandardInputOrAFileAsSqlite3Takes() throws {
        let cli = CLI.make()
        let db = cli.file("plain.db")
        let schema = "CREATE TABLE t(x);\nINSERT INTO t VALUES (1);\nINSERT INTO t VALUES (2);\n"
        let piped = try cli.run(["sql", db], input: Data(schema.utf8))
        #expect(piped.status == 0, "\(piped.stderr)")
        let file = cli.writeFile("q.sql", "SELECT sum(x) FROM t;")
        #expect(try cli.run(["sql", db, "--read", file]).out == "3\n")
        #expect(try cli.run(["sql", db], input: Data("SELECT count(*) FROM t".utf8)).out == "2\n")
        let dot = try cli.run(["sql", db], input: Data(".tables\n".utf8))
        #expect(dot.status == 1 && dot.stderr.contains(".tables is a sqlite3 shell dot-command"), "\(dot.stderr)")
        let both = try cli.run(["sql", cli.file("cipher.db"), "--passphrase-file", "-"], input: Data("SELECT 1".utf8))
        #expect(both.status == 1 && both.stderr.contains("cannot both come from standard input"), "\(both.stderr)")
        #expect(try cli.run(["sql", db, "SELECT 1", "--read", file]).status == 64)
    }

    @Test func outputModesAsTheSqlite3Shell() throws {
        let cli = CLI.make()
        let db = cli.file("m.db")
        let setup = "CREATE TABLE t(id INTEGER, name TEXT, score REAL, data BLOB); "
            + "INSERT INTO t VALUES (1, 'tab\there, \"quoted\"', 2.5, x'00ff'), (2, NULL, NULL, NULL), (3, 'two\nlines/slash', 1e20, x'')"
        #expect(try cli.run(["sql", db, setup]).status == 0)
        let query = "SELECT * FROM t ORDER BY id"

        let list = try cli.run(["sql", db, query]).out
        #expect(list == "1\ttab\\there, \"quoted\"\t2.5\tX'00ff'\n2\t\t\t\n3\ttwo\\nlines/slash\t1.0e+20\tX''\n")
        let headed = try cli.run(["sql", db, "-header", "-nullvalue", "NULL", query]).out
        #expect(headed.hasPrefix("id\tname\tscore\tdata\n1\t") && headed.contains("\n2\tNULL\tNULL\tNULL\n"), "\(headed)")

        let csv = try cli.run(["sql", db, "--csv", "--header", query]).out
        #expect(csv == "id,name,score,data\r\n1,\"tab\there, \"\"quoted\"\"\",2.5,X'00ff'\r\n2,,,\r\n3,\"two\nlines/slash\",1.0e+20,X''\r\n")

        let json = try cli.run(["sql", db, "-json", query]).out
        #expect(json.hasPrefix("[{\"id\":1,\"name\":\"tab\\there, \\\"quoted\\\"\",\"score\":2.5,\"data\":\"X'00ff'\"},\n"), "\(json)")
        #expect(json.contains("{\"id\":2,\"name\":null,\"score\":null,\"data\":null}"))
        #expect(json.contains("two\\nlines/slash"))
        let parsed = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]]
        #expect(parsed?.count == 3 && parsed?[0]["name"] as? String == "tab\there, \"quoted\"")

        let line = try cli.run(["sql", db, "-line", "SELECT id, name AS longer_name FROM t WHERE id < 3 ORDER BY id"]).out
        #expect(line == "         id = 1\nlonger_name = tab\\there, \"quoted\"\n\n         id = 2\nlonger_name = \n")

        let column = try cli.run(["sql", db, "--column", "SELECT id, name FROM t ORDER BY id"]).out
        #expect(column == "id  name\n--  -------------------\n1   tab\\there, \"quoted\"\n2\n3   two\\nlines/slash\n", "\(column)")
        #expect(try cli.run(["sql", db, "--column", "--noheader", "SELECT id FROM t WHERE id = 1"]).out == "1\n")
        #expect(try cli.run(["sql", db, "--csv", "--json", query]).status == 64)

        // Escaped names are measured as printed; a combining mark cannot hide a comma or a quote.
        #expect(try cli.run(["sql", db, "--column", "SELECT 'C:\\temp'"]).out == "'C:\\\\temp'\n----------\nC:\\\\temp\n")
        #expect(try cli.run(["sql", db, "--line", "SELECT 1 AS [a\tb]"]).out == "a\\tb = 1\n")
        #expect(try cli.run(["sql", db, "--csv", "SELECT 'a,' || char(769) || 'b', '\"' || char(769)"]).out == "\"a,\u{301}b\",\"\"\"\u{301}\"\r\n")
    }

    @Test func aKeyThatCannotFitTheFileIsRefusedBeforeAnythingRuns() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("pc", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let plain = cli.file("plain.db")
        #expect(try cli.run(["sql", plain, "CREATE TABLE t(x)"]).status == 0)
        let asClass = try cli.run(["sql", plain, "--class", "A", "--passcode-file", passcode, "SELECT 1"])
        #expect(asClass.status == 1 && asClass.stderr.contains("is a plain SQLite database; --class creates new ones"), "\(asClass.stderr)")
        #expect(!FileManager.default.fileExists(atPath: plain + "-dpkey"))
        let keyed = try cli.run(["sql", plain, "--raw-key-hex", String(repeating: "ab", count: 32), "SELECT 1"])
        #expect(keyed.status == 1 && keyed.stderr.contains("plain SQLite database: it takes no key"), "\(keyed.stderr)")

        let key = String(repeating: "5e", count: 32)
        let keyFile = cli.writeFile("key", key + "\n")
        let cipher = cli.file("cipher.db")
        #expect(try cli.run(["sql", cipher, "--raw-key-file", keyFile, "CREATE TABLE t(x); INSERT INTO t VALUES ('kept')"]).status == 0)
        #expect(try cli.run(["sql", cipher, "--raw-key-hex", key, "SELECT x FROM t"]).out == "kept\n")
        let noKey = try cli.run(["sql", cipher, "SELECT * FROM sqlite_master"])
        #expect(noKey.status == 1 && noKey.stderr.contains("is encrypted, or not a database: give --passphrase-file, --raw-key-hex or --raw-key-file"), "\(noKey.stderr)")
        #expect(!noKey.stderr.contains("LIMIT 1"))
        let classOnCipher = try cli.run(["sql", cipher, "--class", "C", "--passcode-file", passcode, "SELECT 1"])
        #expect(classOnCipher.status == 1 && classOnCipher.stderr.contains("--class creates new ones"))
        #expect(try cli.run(["sql", cipher, "--raw-key-file", keyFile, "SELECT x FROM t"]).out == "kept\n")
    }

    @Test func sqlKeyHelpSaysWhichSQLCipherOpensTheKey() throws {
        let help = try CLI.make().run(["sql-key", "--help"]).out
        #expect(help.contains("SQLCipher 4 or later") && help.contains("3.4.1"), "\(help)")
    }
}
