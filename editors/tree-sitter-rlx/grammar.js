/**
 * Tree-sitter grammar for rlx (.rlx recipes and modules). It follows grammar/rlx.pest and the Pratt
 * parser's precedence table (compiler/src/syntax/parser.rs; docs/language.md): or < and < not <
 * comparisons < + - < * / < prefix - < ^ (right-associative) < `[criterion]` indexing.
 *
 * `src/parser.c` is generated from this file: run ./generate.sh after editing it (docs/editors.md).
 */

const PREC = {
  or: 1,
  and: 2,
  not: 3,
  compare: 4,
  add: 5,
  mul: 6,
  neg: 7,
  pow: 8,
  index: 9,
  call: 10,
};

const commaSep1 = (rule) => seq(rule, repeat(seq(',', rule)));
const commaSep = (rule) => optional(commaSep1(rule));

module.exports = grammar({
  name: 'rlx',

  word: ($) => $.identifier,

  extras: ($) => [/\s/, /\uFEFF/, $.comment],

  rules: {
    source_file: ($) => repeat($._item),

    _item: ($) =>
      choice(
        $.import_declaration,
        $.input_declaration,
        $.param_declaration,
        $.function_declaration,
        $.let_declaration,
        $.rubric_declaration,
        $.reward_section,
        $.advantage_section,
        $.loss_section,
        $.metric_section,
        $.keep_section,
        $.rollout_block,
        $.state_declaration,
      ),

    // `//` comments; `///` doc comments are comments too (highlights.scm tells them apart).
    comment: (_) => token(seq('//', /.*/)),

    // ------------------------------------------------------------------------------------------
    // Declarations

    import_declaration: ($) =>
      seq(
        'import',
        field('source', choice($.std_path, $.package_path, $.string)),
        optional($.import_list),
      ),
    std_path: (_) => token(prec(1, seq('std', repeat1(seq('/', /[A-Za-z_][A-Za-z0-9_]*/))))),
    // `name/module`: a module of a declared package (docs/sharing.md).
    package_path: (_) =>
      token(seq(/[A-Za-z_][A-Za-z0-9_]*/, repeat1(seq('/', /[A-Za-z_][A-Za-z0-9_]*/)))),
    import_list: ($) => seq('.', '{', commaSep1($.identifier), optional(','), '}'),

    input_declaration: ($) =>
      seq(
        'input',
        field('name', $.identifier),
        ':',
        field('type', $.type),
        optional(field('role', $.role)),
        optional(seq('=', field('default', $.literal))),
      ),
    role: (_) => choice('policy', 'value'),

    type: ($) =>
      seq(
        field('element', $.element_type),
        optional(seq('[', commaSep1(field('axis', $.identifier)), ']')),
      ),
    element_type: (_) => choice('f32', 'i32', 'bool'),

    param_declaration: ($) =>
      seq(
        'param',
        field('name', $.identifier),
        optional(seq(':', $.element_type)),
        '=',
        field('value', $.literal),
      ),
    literal: ($) => choice($.signed_number, $.boolean, seq(optional(choice('+', '-')), 'inf')),

    // `state coef : f32 = 0.0 update next_coef(coef, …)` (docs/language.md, "State across steps").
    state_declaration: ($) =>
      seq(
        'state',
        field('name', $.identifier),
        optional(seq(':', $.element_type)),
        '=',
        field('init', choice($.literal, $.identifier)),
        'update',
        field('update', $._expression),
      ),

    function_declaration: ($) =>
      seq(
        'fn',
        field('name', $.identifier),
        '(',
        commaSep($.parameter),
        optional(','),
        ')',
        optional(seq(':', field('return_type', $.type))),
        '=',
        field('body', $._expression),
      ),
    parameter: ($) =>
      seq(
        field('name', $.identifier),
        optional(seq(':', field('type', $.type))),
        optional(seq('=', field('default', $._expression))),
      ),

    let_declaration: ($) => seq('let', field('name', $.identifier), '=', field('value', $._expression)),

    rubric_declaration: ($) =>
      seq(
        'rubric',
        field('name', $.identifier),
        '{',
        repeat(
          choice($.criteria_file, $.criterion, $.interaction, $.aggregate, $.on_veto, $.shape),
        ),
        '}',
      ),
    // `criteria "./style.toml"` or `criteria name/dir/style.json`: criteria from a rubric file.
    criteria_file: ($) => seq('criteria', field('source', choice($.data_path, $.string))),
    data_path: (_) =>
      token(seq(/[A-Za-z_][A-Za-z0-9_]*/, repeat1(seq('/', /[A-Za-z0-9_.\-]+/)))),
    criterion: ($) =>
      seq(
        'criterion',
        field('name', $.identifier),
        repeat(
          choice(
            seq('weight', $._rubric_value),
            seq('points', $._rubric_value),
            seq('levels', '[', commaSep1($.signed_number), optional(','), ']'),
            'veto',
            'critical',
            seq('saturate', $.shape_call),
          ),
        ),
      ),
    interaction: ($) =>
      seq(
        'interact',
        field('first', $.identifier),
        ',',
        field('second', $.identifier),
        ':',
        optional(field('mode', choice('product', 'min'))),
        $._rubric_value,
      ),
    aggregate: ($) => seq('aggregate', $.identifier),
    on_veto: ($) => seq('on_veto', $.shape_call),
    shape: ($) => seq('shape', $.shape_call),
    shape_call: ($) =>
      seq(
        field('name', $.identifier),
        optional(seq('(', commaSep($.shape_argument), optional(','), ')')),
      ),
    shape_argument: ($) => seq(field('name', $.identifier), '=', $._rubric_value),
    _rubric_value: ($) => choice($.signed_number, $.identifier),

    // ------------------------------------------------------------------------------------------
    // Sections

    reward_section: ($) => seq('reward', '=', field('value', $._expression)),
    advantage_section: ($) => seq('advantage', '=', field('value', $._expression)),
    loss_section: ($) => seq('loss', '=', field('value', $._expression)),
    metric_section: ($) =>
      seq('metric', field('name', $.identifier), '=', field('value', $._expression)),
    keep_section: ($) =>
      seq('keep', field('level', choice('group', 'resp')), 'when', field('condition', $._expression)),
    rollout_block: ($) => seq('rollout', '{', repeat(seq($.rollout_entry, optional(','))), '}'),
    rollout_entry: ($) =>
      seq(field('key', $.identifier), '=', field('value', choice($.string_list, $._expression))),
    string_list: ($) => seq('[', commaSep($.string), optional(','), ']'),

    // ------------------------------------------------------------------------------------------
    // Expressions

    _expression: ($) =>
      choice(
        $.number,
        $.boolean,
        $.identifier,
        $.other_reference,
        $.parenthesized,
        $.block,
        $.call,
        $.index,
        $.unary,
        $.binary,
      ),

    parenthesized: ($) => seq('(', $._expression, ')'),
    block: ($) => seq('{', repeat($.local_let), field('body', $._expression), '}'),
    local_let: ($) => seq('let', field('name', $.identifier), '=', field('value', $._expression)),
    other_reference: ($) => seq('other', '.', field('name', $.identifier)),

    // A call's `(` follows its name directly: `f (x)` is not a call (grammar/rlx.pest, call_name).
    call: ($) =>
      prec(
        PREC.call,
        seq(
          field('function', $.identifier),
          token.immediate('('),
          optional(
            seq(
              $.argument,
              optional($.over),
              repeat(seq(',', choice($.argument, $.axis))),
              optional(','),
            ),
          ),
          ')',
        ),
      ),
    argument: ($) =>
      seq(optional(seq(field('name', $.identifier), '=')), field('value', $._expression)),
    // `over tok, batch`: the axes a reduction removes. An axis is a bare name followed by `,` or `)`.
    over: ($) => seq('over', $.axis),
    axis: ($) => prec(1, $.identifier),

    index: ($) =>
      prec(PREC.index, seq(field('value', $._expression), '[', field('criterion', $.identifier), ']')),

    unary: ($) =>
      choice(
        prec(PREC.not, seq(field('operator', 'not'), field('operand', $._expression))),
        prec(PREC.neg, seq(field('operator', '-'), field('operand', $._expression))),
      ),

    binary: ($) =>
      choice(
        ...[
          ['or', PREC.or],
          ['and', PREC.and],
          ['==', PREC.compare],
          ['!=', PREC.compare],
          ['<=', PREC.compare],
          ['>=', PREC.compare],
          ['<', PREC.compare],
          ['>', PREC.compare],
          ['+', PREC.add],
          ['-', PREC.add],
          ['*', PREC.mul],
          ['/', PREC.mul],
        ].map(([operator, precedence]) =>
          prec.left(
            precedence,
            seq(
              field('left', $._expression),
              field('operator', operator),
              field('right', $._expression),
            ),
          ),
        ),
        prec.right(
          PREC.pow,
          seq(field('left', $._expression), field('operator', '^'), field('right', $._expression)),
        ),
      ),

    // ------------------------------------------------------------------------------------------
    // Tokens

    identifier: (_) => /[A-Za-z_][A-Za-z0-9_]*/,
    number: (_) => /([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?/,
    signed_number: (_) => /[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?/,
    boolean: (_) => choice('true', 'false'),
    string: (_) => token(seq('"', repeat(choice(/[^"\\\n]/, /\\["\\nt]/)), '"')),
  },
});
