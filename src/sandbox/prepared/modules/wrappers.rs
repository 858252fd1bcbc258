//! The WebAssembly module that lets Emscripten put JavaScript functions in its function table.
//!
//! A table holds only WebAssembly functions, so Emscripten's `addFunction` wraps a JavaScript
//! function in a one-function module that imports it and exports it again. At start-up Pyodide adds
//! ~260 such functions, one module instance each. `function_table.js` wraps them all with one
//! instance of the module built here instead; the engine compiles it once per list of signatures.

/// A module that imports one function per signature, from module `e` under the names `0`, `1`, …,
/// and exports each again under the same name; `None` if a signature is not in Emscripten's letters
/// (result first, `v` for none; `i`/`p` i32, `j` i64, `f` f32, `d` f64, `e` externref).
pub fn module_bytes(signatures: &[&str]) -> Option<Vec<u8>> {
    let mut types: Vec<&str> = Vec::new();
    let mut type_section = Vec::new();
    let mut import_section = Vec::new();
    let mut export_section = Vec::new();
    for (index, signature) in signatures.iter().enumerate() {
        let type_index = match types.iter().position(|t| t == signature) {
            Some(i) => i,
            None => {
                type_section.extend(function_type(signature)?);
                types.push(signature);
                types.len() - 1
            }
        };
        let name = index.to_string();
        // From module "e", function `name` of type `type_index`.
        import_section.extend([1, b'e']);
        push_name(&mut import_section, &name);
        import_section.push(0);
        push_leb(&mut import_section, type_index);
        // Function `index` (the import) exported as `name`.
        push_name(&mut export_section, &name);
        export_section.push(0);
        push_leb(&mut export_section, index);
    }
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    push_section(&mut module, 1, types.len(), &type_section);
    push_section(&mut module, 2, signatures.len(), &import_section);
    push_section(&mut module, 7, signatures.len(), &export_section);
    Some(module)
}

/// The function type of an Emscripten signature: `0x60`, parameters, results.
fn function_type(signature: &str) -> Option<Vec<u8>> {
    let (&result, params) = signature.as_bytes().split_first()?;
    let results: &[u8] = if result == b'v' { &[] } else { &[result] };
    let mut out = vec![0x60];
    for letters in [params, results] {
        push_leb(&mut out, letters.len());
        for &letter in letters {
            out.push(value_type(letter)?);
        }
    }
    Some(out)
}

fn value_type(letter: u8) -> Option<u8> {
    match letter {
        b'i' | b'p' => Some(0x7f),
        b'j' => Some(0x7e),
        b'f' => Some(0x7d),
        b'd' => Some(0x7c),
        b'e' => Some(0x6f),
        _ => None,
    }
}

fn push_section(module: &mut Vec<u8>, id: u8, count: usize, entries: &[u8]) {
    let mut body = Vec::with_capacity(entries.len() + 5);
    push_leb(&mut body, count);
    body.extend_from_slice(entries);
    module.push(id);
    push_leb(module, body.len());
    module.extend(body);
}

fn push_name(out: &mut Vec<u8>, name: &str) {
    push_leb(out, name.len());
    out.extend_from_slice(name.as_bytes());
}

fn push_leb(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_signatures_make_the_expected_module() {
        let bytes = module_bytes(&["vi", "ipj", "vi"]).unwrap();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0, b'a', b's', b'm', 1, 0, 0, 0,
            // types: (i32) -> (), (i32, i64) -> i32
            1, 11, 2, 0x60, 1, 0x7f, 0, 0x60, 2, 0x7f, 0x7e, 1, 0x7f,
            // imports: e.0 type 0, e.1 type 1, e.2 type 0
            2, 19, 3, 1, b'e', 1, b'0', 0, 0, 1, b'e', 1, b'1', 0, 1, 1, b'e', 1, b'2', 0, 0,
            // exports: "0" func 0, "1" func 1, "2" func 2
            7, 13, 3, 1, b'0', 0, 0, 1, b'1', 0, 1, 1, b'2', 0, 2,
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn unknown_letters_and_empty_signatures_are_refused() {
        assert_eq!(module_bytes(&["vx"]), None);
        assert_eq!(module_bytes(&[""]), None);
        assert!(module_bytes(&[]).is_some());
    }

    #[test]
    fn long_lists_use_multi_byte_lengths() {
        fn read_leb(bytes: &[u8], at: &mut usize) -> usize {
            let (mut value, mut shift) = (0, 0);
            loop {
                let byte = bytes[*at];
                *at += 1;
                value |= usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    return value;
                }
            }
        }
        let bytes = module_bytes(&vec!["iiiiiiii"; 300]).unwrap();
        let mut at = 8;
        let mut sections = Vec::new();
        while at < bytes.len() {
            let id = bytes[at];
            at += 1;
            let size = read_leb(&bytes, &mut at);
            let mut inner = at;
            sections.push((id, size, read_leb(&bytes, &mut inner)));
            at += size;
        }
        assert_eq!(at, bytes.len());
        // One type; 300 imports and exports, whose counts and sizes take two bytes each.
        assert_eq!(
            sections.iter().map(|s| (s.0, s.2)).collect::<Vec<_>>(),
            [(1, 1), (2, 300), (7, 300)]
        );
        assert!(sections[1].1 > 127 && sections[2].1 > 127);
    }
}
